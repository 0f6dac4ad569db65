"""rate_limiter from SQLAlchemy 2 (ORM session, session.begin()) on psycopg 3.

The limit is taken in the session's own transaction, beside the application's write:
committed together, rolled back together. RL429 becomes the application's RateLimited.
Connection: the libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE).
"""

import json

from sqlalchemy import Integer, String, create_engine, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


class Base(DeclarativeBase):
    pass


class Message(Base):
    __tablename__ = "sqlalchemy_messages"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    author: Mapped[str] = mapped_column(String)
    body: Mapped[str] = mapped_column(String)


class RateLimited(Exception):
    def __init__(self, retry_after_ms):
        super().__init__(f"rate limited, retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


def take(session, user, throws=False):
    """One token of 'sqlalchemy_send' for user, in the session's transaction."""
    try:
        return session.execute(
            text("SELECT ok, remaining FROM rate_limiter.rate_limit('sqlalchemy_send', :user, throws => :throws)"),
            {"user": user, "throws": throws},
        ).one()
    except DBAPIError as e:
        if e.orig.sqlstate == "RL429":
            raise RateLimited(json.loads(e.orig.diag.message_detail)["retryAfter"]) from e
        raise


def remaining(session, user):
    # Rounded: a token bucket refills continuously, a few thousandths between the calls.
    value = session.execute(text("SELECT remaining FROM rate_limiter.check_rate_limit('sqlalchemy_send', :u, count => 0)"),
                            {"u": user}).scalar_one()
    return round(value, 2)


def main():
    engine = create_engine("postgresql+psycopg://")  # libpq reads PGHOST, PGPORT, ...
    with engine.begin() as conn:
        conn.execute(text("SELECT rate_limiter.define('sqlalchemy_send', 'token bucket', 3, '1 hour')"))
        conn.execute(text("SELECT rate_limiter.reset_rate_limit('sqlalchemy_send', 'alice')"))
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)

    # 1. The limit and the write commit together.
    with Session(engine) as session, session.begin():
        decision = take(session, "alice")
        session.add(Message(author="alice", body="hello"))
    with Session(engine) as session:
        stored = session.scalars(select(Message.body)).all()
        print(f"1. committed: ok={decision.ok}, messages={stored}, remaining={remaining(session, 'alice')}")

    # 2. An application error after the limit was taken: both roll back.
    try:
        with Session(engine) as session, session.begin():
            take(session, "alice")
            session.add(Message(author="alice", body="lost"))
            raise ValueError("the application failed")
    except ValueError:
        pass
    with Session(engine) as session:
        stored = session.scalars(select(Message.body)).all()
        print(f"2. rolled back: messages={stored}, remaining={remaining(session, 'alice')}")

    # 3. Past the limit, throws => true raises RL429; the DETAIL's retryAfter comes along.
    try:
        with Session(engine) as session, session.begin():
            for _ in range(3):
                take(session, "alice", throws=True)
    except RateLimited as e:
        print(f"3. RateLimited from SQLSTATE {e.__cause__.orig.sqlstate}: retry after {round(e.retry_after_ms / 1000)} s")


if __name__ == "__main__":
    main()
