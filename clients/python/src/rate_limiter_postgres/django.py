"""A Django view decorator that takes a limit for each request and answers 429 with the
extension's ``RateLimit-Policy``, ``RateLimit`` and ``Retry-After`` headers:

    @rate_limited("api", key=lambda request: request.META["REMOTE_ADDR"])
    def items(request): ...

It runs on Django's connection. A view that raises (``Http404``, ``PermissionDenied``, an
error) keeps its token: failures are what limits usually guard (guessing, brute force).
With ``ATOMIC_REQUESTS`` the decorator runs the request's transaction itself: the limit,
then the view's work on a savepoint; the work commits with the token, and a view that
raises rolls back its own work while the token commits. ``refund_on_error=True`` gives the
token back when the view raises (the limit rolls back with the work).
"""

from __future__ import annotations

import inspect
from functools import wraps
from typing import Any, Callable, Optional

from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse

from ._sync import RateLimiter


def _client_address(request: HttpRequest) -> Optional[str]:
    return request.META.get("REMOTE_ADDR")


def rate_limited(name: str, *, key: Callable[[HttpRequest], Optional[str]] = _client_address, count: float = 1,
                 config: Optional[dict[str, Any]] = None, using: str = "default", schema: str = "rate_limiter",
                 refund_on_error: bool = False):
    """Take ``count`` from (name, key(request)) before the view; a denial is a 429. A view
    that raises keeps its token unless ``refund_on_error``."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        if inspect.iscoroutinefunction(view):
            raise TypeError(f"rate_limited takes a synchronous view; {view.__name__} is async")

        def limited(request: HttpRequest, run_view: Callable[[], HttpResponse]) -> HttpResponse:
            limiter = RateLimiter.for_django(using, schema)
            d = limiter.limit(name, key(request), count, config=config)
            headers = limiter.headers(name, d, config=config)
            response = run_view() if d.ok else HttpResponse(
                f'rate limit "{name}" exceeded', status=429, content_type="text/plain")
            for header, value in headers.items():
                response[header] = value
            return response

        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            def run_view() -> HttpResponse:
                return view(request, *args, **kwargs)

            if refund_on_error:
                # The limit and the view's work in one transaction, which a raise rolls back.
                with transaction.atomic(using=using):
                    return limited(request, run_view)
            if not connections[using].settings_dict.get("ATOMIC_REQUESTS"):
                # The limit commits at once (unless the caller's own transaction holds it).
                return limited(request, run_view)
            # The request's transaction, as ATOMIC_REQUESTS would make it, holds the limit,
            # and the view's work is on a savepoint of it, which a view that raises rolls back
            # alone: the transaction then commits the token, and the error goes on.
            failed: list[Exception] = []

            def on_savepoint() -> HttpResponse:
                try:
                    with transaction.atomic(using=using):
                        return run_view()
                except Exception as error:  # noqa: BLE001 - raised again once the token commits
                    failed.append(error)
                    return HttpResponse(status=500)

            with transaction.atomic(using=using):
                response = limited(request, on_savepoint)
            if failed:
                raise failed[0]
            return response

        # The decorator makes the request's transaction itself (see above).
        return transaction.non_atomic_requests(using=using)(wrapped)

    return decorator
