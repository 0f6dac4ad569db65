"""The Django decorator on Django's own connection: a 429 with the extension's headers; under
ATOMIC_REQUESTS the limit and the view's work in one transaction, where a view that raises
rolls back its work and keeps its token (refund_on_error gives it back)."""

import django
from django.conf import settings

from conftest import DB, HOST, PORT, USER

settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": DB, "USER": USER, "HOST": HOST,
                           "PORT": PORT, "ATOMIC_REQUESTS": True}},
    ALLOWED_HOSTS=["testserver"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[],
)
django.setup()

from django.db import connection, transaction  # noqa: E402
from django.http import Http404, HttpResponse  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import path  # noqa: E402

from rate_limiter_postgres.django import rate_limited  # noqa: E402

CONFIG = {"kind": "fixed window", "rate": 2, "period": 3600000}


@rate_limited("django_view", key=lambda request: request.GET["user"], config=CONFIG)
def view(request):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO django_view_writes VALUES (%s)", [request.GET["user"]])
    if request.GET.get("fail"):
        raise RuntimeError("the view failed after the limit was taken")
    return HttpResponse("ok")


@rate_limited("django_invite", key=lambda request: request.GET["user"],
              config={"kind": "fixed window", "rate": 3, "period": 3600000})
def invite(request):
    raise Http404("no such invite")  # as get_object_or_404 on a wrong guess


@rate_limited("django_refund", key=lambda request: request.GET["user"], config=CONFIG, refund_on_error=True)
def refunding(request):
    if request.GET.get("fail"):
        raise RuntimeError("the view failed after the limit was taken")
    return HttpResponse("ok")


urlpatterns = [path("view", view), path("invite", invite), path("refunding", refunding)]


def writes(user):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_view_writes WHERE k = %s", [user])
        return cursor.fetchone()[0]


def setup_module():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS django_view_writes (k text)")


def test_a_denied_request_is_a_429_with_the_extensions_headers(name):
    client = Client(raise_request_exception=False)
    answers = [client.get("/view", {"user": name}) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0]["RateLimit"].startswith('"django_view";r=1')
    assert int(answers[2]["Retry-After"]) > 0


def test_throws_raises_rate_limited_through_djangos_own_errors(name):
    from rate_limiter_postgres import RateLimited, RateLimiter

    limiter = RateLimiter.for_django()
    limiter.limit(name, "k", config={"kind": "fixed window", "rate": 1, "period": 60000}, throws=True)
    try:
        limiter.limit(name, "k", config={"kind": "fixed window", "rate": 1, "period": 60000}, throws=True)
    except RateLimited as e:
        assert e.limit == name and e.retry_after > 0
    else:
        raise AssertionError("RL429 was not raised as RateLimited")


def test_a_view_that_raises_keeps_its_token_and_loses_its_work(name):
    client = Client(raise_request_exception=False)
    assert client.get("/view", {"user": name, "fail": "1"}).status_code == 500
    assert writes(name) == 0, "the view's work rolled back"
    assert [client.get("/view", {"user": name}).status_code for _ in range(2)] == [200, 429], \
        "the failed request's token stayed taken"
    assert writes(name) == 1, "the work of the one granted request committed"


def test_guesses_that_end_in_404_are_limited(name):
    """Issue 41: with a limit of 3 an hour, 20 of 20 guesses reached the view (each 404 gave
    its token back) and none got a 429."""
    client = Client(raise_request_exception=False)
    codes = [client.get("/invite", {"user": name}).status_code for _ in range(20)]
    assert codes == [404] * 3 + [429] * 17


def test_refund_on_error_gives_the_token_back_with_the_work(name):
    client = Client(raise_request_exception=False)
    for _ in range(3):
        assert client.get("/refunding", {"user": name, "fail": "1"}).status_code == 500
    assert [client.get("/refunding", {"user": name}).status_code for _ in range(3)] == [200, 200, 429]
    with transaction.atomic():
        pass
