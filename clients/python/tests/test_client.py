"""The client on each driver: decisions, RL429 as RateLimited, and limits that roll back with
the transaction they were taken in (psycopg, asyncpg, SQLAlchemy, Django)."""

import asyncio

import asyncpg
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from conftest import DB, HOST, PORT, USER
from rate_limiter_postgres import AsyncRateLimiter, RateLimited, RateLimiter

WINDOW = {"kind": "fixed window", "rate": 1, "period": 3600000}


def test_decisions_headers_and_credit_on_psycopg(conn, name):
    rl = RateLimiter(conn)
    conn.execute("SELECT rate_limiter.define(%s, 'fixed window', 2, '1 hour')", [name])
    first = rl.limit(name, "alice")
    assert (first.ok, first.remaining, first.granted) == (True, 1, 1)
    assert rl.limit(name, "alice").ok
    denied = rl.limit(name, "alice")
    assert (denied.ok, denied.reason, denied.limited_by) == (False, "exhausted", name)
    headers = rl.headers(name, denied)
    assert headers["Retry-After"] == str(-(-int(denied.retry_after) // 1000))
    assert headers["RateLimit-Policy"] == f'"{name}";q=2;qu="requests";w=3600'
    # A key's own numbers, its override's, when the key is given.
    conn.execute("SELECT rate_limiter.override(%s, 'bob', rate => 5)", [name])
    assert rl.headers(name, rl.limit(name, "bob"), key="bob")["RateLimit-Policy"] == f'"{name}";q=5;qu="requests";w=3600'
    assert rl.credit(name, "alice").granted == -1
    assert rl.check(name, "alice").ok
    rl.reset(name, "alice")
    assert rl.check(name, "alice", 0).remaining == 2


def test_limit_ok_is_limits_ok_and_takes_as_it_does(conn, name):
    rl = RateLimiter(conn)
    conn.execute("SELECT rate_limiter.define(%s, 'fixed window', 3, '1 hour')", [name])
    # Interleaved with limit on one key: one count, whichever asks.
    assert rl.limit_ok(name, "k") is True
    assert rl.limit(name, "k").ok
    assert rl.limit_ok(name, "k", 2) is False, "one left: denied, nothing taken"
    assert rl.limit_ok(name, "k") is True
    assert rl.check(name, "k", 0).remaining == 0
    assert rl.limit_ok(name, "k") is False
    with pytest.raises(RateLimited):
        rl.limit_ok(name, "k", throws=True)
    memory = {"kind": "token bucket", "rate": 1, "period": 3600000, "durable": False}

    async def on_asyncpg():
        pg = await asyncpg.connect(host=HOST, port=int(PORT), user=USER, database=DB)
        try:
            arl = AsyncRateLimiter(pg)
            assert await arl.limit_ok(name, 7, config=memory) is True, "an integer key, as text"
            assert await arl.limit_ok(name, "7", config=memory) is False
        finally:
            await pg.close()

    asyncio.run(on_asyncpg())


def test_throws_raises_rate_limited_with_retry_after(conn, name):
    rl = RateLimiter(conn)
    config = {"kind": "token bucket", "rate": 1, "period": 60000}
    rl.limit(name, "k", config=config, throws=True)
    with pytest.raises(RateLimited) as denied:
        rl.limit(name, "k", config=config, throws=True)
    assert denied.value.limit == name and 59000 < denied.value.retry_after <= 60000


def test_a_psycopg_transaction_that_rolls_back_gives_the_token_back(name):
    with psycopg.connect() as c:
        rl = RateLimiter(c)
        assert rl.limit(name, "k", config=WINDOW).ok
        c.rollback()
        assert rl.limit(name, "k", config=WINDOW).ok, "the rolled-back token came back"
        c.commit()
        assert not rl.limit(name, "k", config=WINDOW).ok


def test_a_sqlalchemy_session_takes_the_limit_in_its_transaction(name):
    engine = create_engine(f"postgresql+psycopg://{USER}@/{DB}?host={HOST}&port={PORT}")
    with Session(engine) as session:
        assert RateLimiter.for_sqlalchemy(session).limit(name, "k", config=WINDOW).ok
        session.rollback()
        assert RateLimiter.for_sqlalchemy(session).limit(name, "k", config=WINDOW).ok
        session.execute(text("SELECT 1"))
        session.commit()
        assert not RateLimiter.for_sqlalchemy(session).limit(name, "k", config=WINDOW).ok
    engine.dispose()


def test_asyncpg_and_async_psycopg_answer_alike_and_roll_back(name):
    async def main():
        pg = await asyncpg.connect(host=HOST, port=int(PORT), user=USER, database=DB)
        try:
            rl = AsyncRateLimiter(pg)
            async with pg.transaction():
                assert (await rl.limit(name, "a", config=WINDOW)).ok
            tr = pg.transaction()
            await tr.start()
            assert not (await rl.limit(name, "a", config=WINDOW)).ok
            await tr.rollback()
            with pytest.raises(RateLimited):
                await rl.limit(name, "a", config=WINDOW, throws=True)
            assert (await rl.limit(name, 42, config=WINDOW)).ok, "an integer key, as text"
            assert (await rl.value(name, "a", config=WINDOW))[0] == 0
            headers = await rl.headers(name, await rl.check(name, "a", config=WINDOW), config=WINDOW)
            assert headers["RateLimit"].startswith(f'"{name}";r=0')
            lease = await rl.acquire(name + "_slots", "t", lease=60000, config={"kind": "concurrency", "rate": 1, "period": 1000})
            assert lease.ok and await rl.release(name + "_slots", "t", lease.lease_id)
        finally:
            await pg.close()
        async with await psycopg.AsyncConnection.connect() as c:
            rl = AsyncRateLimiter(c)
            assert (await rl.limit(name, "b", config=WINDOW)).ok
            await c.rollback()
            assert (await rl.limit(name, "b", config=WINDOW)).ok
            await c.commit()
            assert not (await rl.check(name, "b", config=WINDOW)).ok
        engine = create_async_engine(f"postgresql+asyncpg://{USER}@/{DB}?host={HOST}&port={PORT}")
        async with AsyncSession(engine) as session:
            rl = await AsyncRateLimiter.for_sqlalchemy(session)
            assert (await rl.limit(name, "c", config=WINDOW)).ok
            await session.rollback()
            rl = await AsyncRateLimiter.for_sqlalchemy(session)
            assert (await rl.limit(name, "c", config=WINDOW)).ok
        await engine.dispose()

    asyncio.run(main())
