"""Issue 64: a plan changed mid-window keeps what the key used, on every kind and wherever
its count lives (a row, shared memory, a hot limit's escrow and log, the SQL-only edition's
row): raised from 3 to 10 after 3 taken, 7 more; a tier raised from 5 to 8 after 5 taken, 3
more; an override of 6 that ends (or, for hot and memory limits, which take no end, is
removed) after 4 were taken under a limit of 2, none; redefined from 3 to 5 after 3 taken,
2 more, and lowered to 1, none. 0.7.0 kept a token bucket's and a fixed window's level
instead: 0, 0, 2 and 2. The extension's durable rows are held to the same sequences on every
version by a #[pg_test] (a_plan_changed_mid_window_keeps_what_the_key_used_on_every_kind)."""

import pytest

from clusters import every_version
from editions import edition  # noqa: F401 - a fixture

NOW = "2026-01-01 00:00:00+00"
ALL_KINDS = ["token bucket", "fixed window", "sliding window", "rolling window"]
# Where a key's count lives, and the kinds each place keeps.
WHERE = {
    "memory": ({"durable": False}, ["token bucket", "fixed window", "sliding window"]),
    "hot": ({"hot": True}, ALL_KINDS),
}


def admitted(c, name, tries):
    return sum(c.execute("SELECT ok FROM rate_limiter.rate_limit(%s, 'k')", (name,)).fetchone()[0] for _ in range(tries))


def plans_keep_what_was_used(c, kind, prefix, extra, ends):
    """The sequences on `kind`, limits named `prefix`..., defined with `extra`; `ends`: the
    override of 6 ends by its `until`, else it is removed. Each change committed before the
    next call (c in autocommit)."""
    def define(name, rate):
        args = "".join(f", {k} => {v}" for k, v in extra.items())
        start = "" if kind == "token bucket" else f", start => '{NOW}'"
        c.execute(f"SELECT rate_limiter.define(%s, %s, %s, '1 hour'{start}{args})", (prefix + name, kind, rate))

    def at(ts):
        c.execute(f"SET rate_limiter.fake_now = '{ts}'")

    at(NOW)
    define("raised", 3)
    assert admitted(c, prefix + "raised", 4) == 3
    c.execute("SELECT rate_limiter.override(%s, 'k', rate => 10)", (prefix + "raised",))
    assert admitted(c, prefix + "raised", 10) == 7, f"{kind}: raised from 3 to 10 after 3 taken"

    define("tiered", 1)
    c.execute("SELECT rate_limiter.define_tier(%s, 'pro', rate => 5)", (prefix + "tiered",))
    c.execute("SELECT rate_limiter.override(%s, 'k', tier => 'pro')", (prefix + "tiered",))
    assert admitted(c, prefix + "tiered", 6) == 5
    c.execute("SELECT rate_limiter.define_tier(%s, 'pro', rate => 8)", (prefix + "tiered",))
    assert admitted(c, prefix + "tiered", 5) == 3, f"{kind}: a tier raised from 5 to 8 after 5 taken"

    define("ending", 2)
    until = "2026-01-01 00:00:30+00" if ends else "infinity"
    c.execute("SELECT rate_limiter.override(%s, 'k', rate => 6, until => %s)", (prefix + "ending", until))
    assert admitted(c, prefix + "ending", 4) == 4
    if ends:
        at("2026-01-01 00:01:00+00")
    else:
        c.execute("SELECT rate_limiter.remove_override(%s, 'k')", (prefix + "ending",))
    assert admitted(c, prefix + "ending", 3) == 0, f"{kind}: an override of 6 gone after 4 taken, under a limit of 2"

    at(NOW)
    define("redefined", 3)
    assert admitted(c, prefix + "redefined", 4) == 3
    define("redefined", 5)
    assert admitted(c, prefix + "redefined", 5) == 2, f"{kind}: redefined from 3 to 5 after 3 taken"
    define("redefined", 1)
    assert admitted(c, prefix + "redefined", 2) == 0, f"{kind}: lowered to 1 after 5 taken"


@pytest.mark.parametrize("where", WHERE)
def test_a_plan_changed_mid_window_keeps_what_the_key_used_in_memory_and_hot(test_cluster, database_name, name, where):
    extra, kinds = WHERE[where]
    with test_cluster.connect(database_name) as c:
        for i, kind in enumerate(kinds):
            plans_keep_what_was_used(c, kind, f"{name}_{i}_", extra, ends=False)
        if where == "memory":
            assert c.execute("SELECT count(*) FROM rate_limiter.state WHERE name LIKE %s", (name + "%",)).fetchone() == (0,), \
                "every count kept in shared memory"


@every_version
def test_a_plan_changed_mid_window_keeps_what_the_key_used_in_the_edition(test_cluster, edition, pg):
    dbname, _ = edition
    # A superuser's session: the test cluster preloads the library, whose clock setting only a
    # superuser may move.
    with test_cluster.connect(dbname) as c:
        for i, kind in enumerate(ALL_KINDS):
            plans_keep_what_was_used(c, kind, f"p{i}_", {}, ends=True)
