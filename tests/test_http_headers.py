"""The RateLimit fields of draft-ietf-httpapi-ratelimit-headers-11 as a client reads them:
parsed with a structured-field parser (RFC 9651, http_sfv), not compared as strings, for every
kind of limit, a key's own numbers, a partition key of any bytes, draft 09 on request, and the
problem-details body of a denial (docs/api.md, the HTTP headers)."""

import json

from http_sfv import List, Token

from calls import define
from clusters import every_version
from editions import edition  # noqa: F401 - a fixture

HEADERS = ("SELECT rate_limiter.http_headers(%(n)s, d, key => %(k)s, draft => %(draft)s, partition_key => %(pk)s), "
           "rate_limiter.http_problem(d) FROM rate_limiter.rate_limit(%(n)s, %(k)s, %(c)s) d")


def fields(conn, name, key="k", count=1, draft=11, pk=False):
    """The headers and problem of a call, the two fields parsed: {field: [(name, params)]}."""
    headers, problem = conn.execute(HEADERS, {"n": name, "k": key, "c": count, "draft": draft, "pk": pk}).fetchone()
    parsed = {}
    for field in ("RateLimit-Policy", "RateLimit"):
        items = List()
        items.parse(headers[field].encode("ascii"))
        for item in items:
            assert isinstance(item.value, str) and not isinstance(item.value, Token), "a String, as draft 11 wants"
        parsed[field] = [(item.value, dict(item.params)) for item in items]
    return parsed, headers.get("Retry-After"), problem


def whole(params, *names):
    for n in names:
        assert type(params[n]) is int and params[n] >= 0, (n, params)


def test_every_kind_gives_integer_quotas_in_their_units(test_conn, name):
    kinds = [("token bucket", 10, "1 minute", (10, 60)), ("fixed window", 1.5, "1 second", (3, 2)),
             ("sliding window", 2.5, "1 minute", (5, 120)), ("rolling window", 7, "1 second", (7, 1))]
    for kind, rate, period, (q, w) in kinds:
        define(test_conn, f"{name}_{kind[0]}", kind, rate=rate, period=period)
        parsed, _, problem = fields(test_conn, f"{name}_{kind[0]}")
        [(policy, params)] = parsed["RateLimit-Policy"]
        assert policy == f"{name}_{kind[0]}" and params == {"q": q, "qu": "requests", "w": w}, kind
        [(_, now)] = parsed["RateLimit"]
        whole(now, "r", "t")
        assert problem is None
    define(test_conn, f"{name}_c", "concurrency", rate=3, period="1 second")
    parsed, _, _ = fields(test_conn, f"{name}_c")
    assert parsed["RateLimit-Policy"] == [(f"{name}_c", {"q": 3, "qu": "concurrent-requests"})]


def test_a_keys_override_and_its_partition_key_travel_in_the_fields(test_conn, name):
    define(test_conn, name, "token bucket", rate=10, period="1 minute")
    test_conn.execute("SELECT rate_limiter.override(%s, 'pro: ключ \"7\"', rate => 100)", (name,))
    parsed, _, _ = fields(test_conn, name, key='pro: ключ "7"', pk=True)
    [(_, policy)] = parsed["RateLimit-Policy"]
    [(_, now)] = parsed["RateLimit"]
    assert (policy["q"], policy["pk"], now["pk"]) == (100, 'pro: ключ "7"'.encode(), 'pro: ключ "7"'.encode())
    assert now["r"] == 99
    parsed, _, _ = fields(test_conn, name, key="free")
    assert parsed["RateLimit-Policy"][0][1] == {"q": 10, "qu": "requests", "w": 60}, "no pk unless asked, the limit's own numbers"


def test_a_denial_has_retry_after_and_a_problem_naming_the_limit(test_conn, name):
    define(test_conn, name, "fixed window", rate=2, period="1 minute")
    fields(test_conn, name, count=2)
    parsed, retry_after, problem = fields(test_conn, name)
    [(_, now)] = parsed["RateLimit"]
    assert now["r"] == 0 and int(retry_after) == now["t"] > 0
    assert problem == {"type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
                       "title": "Request cannot be satisfied as assigned quota has been exceeded",
                       "status": 429, "violated-policies": [name], "rate_limiter-reason": "exhausted"}
    assert json.loads(json.dumps(problem)) == problem


def test_draft_nine_stays_on_request_for_the_clients_that_parse_it(test_conn, name):
    define(test_conn, name, "token bucket", rate=0.5, period="500 milliseconds")
    parsed, _, _ = fields(test_conn, name, count=0.5, draft=9, pk=True)
    [(_, policy)] = parsed["RateLimit-Policy"]
    assert set(policy) == {"q", "w"} and float(policy["q"]) == 0.5 and policy["w"] == 1, "0.6.0's fields, no pk"


@every_version
def test_integers_stay_within_fifteen_digits_in_the_extension_and_the_edition(test_conn, test_cluster, edition, name, pg):
    """Issue 64, F7: a rate of 1e15 wrote q=1000000000000000, 16 digits, and a strict parser
    (RFC 9651 allows 15) dropped the whole field. Each integer is now told as at most
    999,999,999,999,999: a quota so large told as less than it is, never more."""
    dbname, owner = edition
    with test_cluster.connect(dbname, user=owner) as on_edition:
        for conn in (test_conn, on_edition):
            define(conn, name, "token bucket", rate=1e15, period="1 second")
            parsed, _, _ = fields(conn, name)
            [(_, policy)] = parsed["RateLimit-Policy"]
            assert policy == {"q": 999_999_999_999_999, "qu": "requests", "w": 1}
            [(_, now)] = parsed["RateLimit"]
            assert now["r"] == 999_999_999_999_999
            parsed, _, _ = fields(conn, name, draft=9)
            assert parsed["RateLimit-Policy"][0][1]["q"] == 999_999_999_999_999
