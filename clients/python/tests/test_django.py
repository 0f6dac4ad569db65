"""The Django decorator on Django's own connection: a 429 with the extension's headers, and a
limit that rolls back with the view's transaction (ATOMIC_REQUESTS)."""

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

from django.db import transaction  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import path  # noqa: E402

from rate_limiter_postgres.django import rate_limited  # noqa: E402

CONFIG = {"kind": "fixed window", "rate": 2, "period": 3600000}


@rate_limited("django_view", key=lambda request: request.GET["user"], config=CONFIG)
def view(request):
    if request.GET.get("fail"):
        raise RuntimeError("the view failed after the limit was taken")
    return HttpResponse("ok")


urlpatterns = [path("view", view)]


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


def test_a_view_that_fails_gives_its_token_back(name):
    client = Client(raise_request_exception=False)
    for _ in range(3):
        assert client.get("/view", {"user": name, "fail": "1"}).status_code == 500
    assert [client.get("/view", {"user": name}).status_code for _ in range(3)] == [200, 200, 429]
    with transaction.atomic():
        pass
