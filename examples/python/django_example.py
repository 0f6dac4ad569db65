"""rate_limiter from Django's ORM (transaction.atomic()) on psycopg 3.

A standalone script: settings, one model and its table, then the four steps. The limit
is taken with the atomic block's connection, so it commits or rolls back with the
model's write. RL429 becomes the application's RateLimited.
Connection: the libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE).
"""

import json
import os

import django
from django.conf import settings

settings.configure(
    DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("PGDATABASE", "postgres"),
        "HOST": os.environ.get("PGHOST", "/tmp"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "USER": os.environ.get("PGUSER", "postgres"),
    }},
    INSTALLED_APPS=[],
    USE_TZ=True,
)
django.setup()

from django.db import DatabaseError, connection, models, transaction  # noqa: E402


class Message(models.Model):
    author = models.TextField()
    body = models.TextField()

    class Meta:
        app_label = "example"
        db_table = "django_messages"


class RateLimited(Exception):
    def __init__(self, retry_after_ms):
        super().__init__(f"rate limited, retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


def take(user, throws=False):
    """One token of 'django_send' for user, in the current transaction."""
    with connection.cursor() as cursor:
        try:
            cursor.execute("SELECT ok, remaining FROM rate_limiter.rate_limit('django_send', %s, throws => %s)",
                           [user, throws])
        except DatabaseError as e:
            if getattr(e.__cause__, "sqlstate", None) == "RL429":
                raise RateLimited(json.loads(e.__cause__.diag.message_detail)["retryAfter"]) from e
            raise
        return cursor.fetchone()


def remaining(user):
    with connection.cursor() as cursor:
        cursor.execute("SELECT remaining FROM rate_limiter.check_rate_limit('django_send', %s, count => 0)", [user])
        # Rounded: a token bucket refills continuously, a few thousandths between the calls.
        return round(cursor.fetchone()[0], 2)


def main():
    with connection.cursor() as cursor:
        cursor.execute("SELECT rate_limiter.define('django_send', 'token bucket', 3, '1 hour')")
        cursor.execute("SELECT rate_limiter.reset_rate_limit('django_send', 'alice')")
        # Step 4's limit and plans, the administrator's, afresh.
        cursor.execute("SELECT rate_limiter.define('django_posts', 'sliding window', 2, '30 days')")
        cursor.execute("SELECT rate_limiter.define_tier('django_posts', 'pro', rate => 5, note => '5 posts a month')")
        cursor.execute("SELECT rate_limiter.remove_override('django_posts', 'alice')")
        cursor.execute("SELECT rate_limiter.reset_rate_limit('django_posts', 'alice')")
        cursor.execute("DROP TABLE IF EXISTS django_messages")
    with connection.schema_editor() as editor:
        editor.create_model(Message)

    # 1. The limit and the write commit together.
    with transaction.atomic():
        ok, _ = take("alice")
        Message.objects.create(author="alice", body="hello")
    bodies = list(Message.objects.values_list("body", flat=True))
    print(f"1. committed: ok={ok}, messages={bodies}, remaining={remaining('alice')}")

    # 2. An application error after the limit was taken: both roll back.
    try:
        with transaction.atomic():
            take("alice")
            Message.objects.create(author="alice", body="lost")
            raise ValueError("the application failed")
    except ValueError:
        pass
    bodies = list(Message.objects.values_list("body", flat=True))
    print(f"2. rolled back: messages={bodies}, remaining={remaining('alice')}")

    # 3. Past the limit, throws => true raises RL429; the DETAIL's retryAfter comes along.
    try:
        with transaction.atomic():
            for _ in range(3):
                take("alice", throws=True)
    except RateLimited as e:
        print(f"3. RateLimited from SQLSTATE {e.__cause__.__cause__.sqlstate}: retry after {round(e.retry_after_ms / 1000)} s")


    # 4. A plan change mid-window, made by the administrator alone: the application's call is
    # the same, and what alice took before still counts.
    def post():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT ok FROM rate_limiter.rate_limit('django_posts', 'alice')")
            return cursor.fetchone()[0]

    before = sum(post() for _ in range(3))
    with connection.cursor() as cursor:
        cursor.execute("SELECT rate_limiter.override('django_posts', 'alice', tier => 'pro', note => 'upgraded')")
    after = sum(post() for _ in range(5))
    print(f"4. upgraded to 'pro' mid-window: {before} posts before, {after} after (5 in the window in all)")


if __name__ == "__main__":
    main()
