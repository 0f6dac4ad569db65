"""A Django view decorator that takes a limit for each request and answers 429 with the
extension's ``RateLimit-Policy``, ``RateLimit`` and ``Retry-After`` headers:

    @rate_limited("api", key=lambda request: request.META["REMOTE_ADDR"])
    def items(request): ...

It runs on Django's connection, so with ``ATOMIC_REQUESTS`` (or inside
``transaction.atomic()``) the limit commits or rolls back with the view's work.
"""

from __future__ import annotations

import inspect
from functools import wraps
from typing import Any, Callable, Optional

from django.http import HttpRequest, HttpResponse

from ._sync import RateLimiter


def _client_address(request: HttpRequest) -> Optional[str]:
    return request.META.get("REMOTE_ADDR")


def rate_limited(name: str, *, key: Callable[[HttpRequest], Optional[str]] = _client_address, count: float = 1,
                 config: Optional[dict[str, Any]] = None, using: str = "default", schema: str = "rate_limiter"):
    """Take ``count`` from (name, key(request)) before the view; a denial is a 429."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        if inspect.iscoroutinefunction(view):
            raise TypeError(f"rate_limited takes a synchronous view; {view.__name__} is async")

        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            limiter = RateLimiter.for_django(using, schema)
            d = limiter.limit(name, key(request), count, config=config)
            headers = limiter.headers(name, d, config=config)
            response = view(request, *args, **kwargs) if d.ok else HttpResponse(
                f'rate limit "{name}" exceeded', status=429, content_type="text/plain")
            for header, value in headers.items():
                response[header] = value
            return response

        return wrapped

    return decorator
