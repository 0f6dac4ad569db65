//! Finding, locking and writing rows of `rate_limiter.state` and reading
//! `rate_limiter.limits`, through SPI plans prepared once per backend.
//!
//! Every statement qualifies its tables, functions and operators, so a caller's hostile
//! `search_path` cannot redirect it. A NULL key is one shared value; the unique index treats
//! NULLs as equal, and each statement comes in a `key = $2` and a `key IS NULL` variant so
//! both use the index.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{PgBuiltInOids, PgOid};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiTupleTable};

use crate::bucket::State;
use crate::clock;
use crate::config::LimitRow;

/// Identifies one shard of one limit.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    pub name: &'a str,
    pub key: Option<&'a str>,
    pub shard: i32,
}

thread_local! {
    /// Plans kept for the life of the backend. PostgreSQL re-plans them itself when the
    /// tables change (even when the extension is dropped and created again).
    static PLANS: RefCell<HashMap<String, OwnedPreparedStatement>> = RefCell::new(HashMap::new());
}

const TEXT: PgOid = PgOid::BuiltIn(PgBuiltInOids::TEXTOID);
const INT4: PgOid = PgOid::BuiltIn(PgBuiltInOids::INT4OID);
const FLOAT8: PgOid = PgOid::BuiltIn(PgBuiltInOids::FLOAT8OID);
const TIMESTAMPTZ: PgOid = PgOid::BuiltIn(PgBuiltInOids::TIMESTAMPTZOID);

const SLOT_TYPES: [PgOid; 3] = [TEXT, TEXT, INT4];

/// The WHERE clause for one slot; `$1` name, `$2` key, `$3` shard.
fn slot_where(key: Option<&str>) -> &'static str {
    match key {
        Some(_) => {
            "name OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
             AND shard OPERATOR(pg_catalog.=) $3"
        }
        None => "name OPERATOR(pg_catalog.=) $1 AND key IS NULL AND shard OPERATOR(pg_catalog.=) $3",
    }
}

fn slot_args<'a>(slot: Slot<'a>) -> Vec<DatumWithOid<'a>> {
    vec![slot.name.into(), slot.key.into(), slot.shard.into()]
}

/// Run `sql` through a plan prepared on first use. `mutating` plans may lock and write.
fn run<'conn, R>(
    client: &SpiClient<'conn>,
    sql: &str,
    types: &[PgOid],
    args: &[DatumWithOid<'_>],
    mutating: bool,
    read: impl FnOnce(SpiTupleTable<'conn>) -> R,
) -> R {
    PLANS.with(|plans| {
        if !plans.borrow().contains_key(sql) {
            let plan = if mutating {
                client.prepare_mut(sql, types)
            } else {
                client.prepare(sql, types)
            }
            .unwrap_or_else(|e| panic!("preparing {sql}: {e}"));
            plans.borrow_mut().insert(sql.to_owned(), plan.keep());
        }
        let plans = plans.borrow();
        let table = client
            .select(&plans[sql], None, args)
            .unwrap_or_else(|e| panic!("running {sql}: {e}"));
        read(table)
    })
}

fn first_state(table: SpiTupleTable<'_>) -> Option<State> {
    let row = table.first();
    if row.is_empty() {
        return None;
    }
    let value: f64 = row.get(1).ok()??;
    let ts: TimestampWithTimeZone = row.get(2).ok()??;
    Some(State { value, ts: clock::timestamptz_ms(ts) })
}

/// The named limit's row, if any.
pub fn load_limit(client: &SpiClient<'_>, name: &str) -> Option<LimitRow> {
    let sql = "SELECT kind, rate, period, capacity, max_reserved, shards, start \
               FROM rate_limiter.limits WHERE name OPERATOR(pg_catalog.=) $1";
    run(client, sql, &[TEXT], &[name.into()], false, |table| {
        let row = table.first();
        if row.is_empty() {
            return None;
        }
        // The columns are declared NOT NULL where read with `required`.
        let column = "rate_limiter.limits has its declared columns";
        let required = "NOT NULL column";
        Some(LimitRow {
            kind: row.get(1).expect(column).expect(required),
            rate: row.get(2).expect(column).expect(required),
            period: row.get(3).expect(column).expect(required),
            capacity: row.get(4).expect(column),
            max_reserved: row.get(5).expect(column),
            shards: row.get(6).expect(column).expect(required),
            start: row.get(7).expect(column),
        })
    })
}

/// The committed state of a shard, without locking it.
pub fn read(client: &SpiClient<'_>, slot: Slot<'_>) -> Option<State> {
    let sql = format!("SELECT value, ts FROM rate_limiter.state WHERE {}", slot_where(slot.key));
    run(client, &sql, &SLOT_TYPES, &slot_args(slot), false, first_state)
}

/// Lock a shard's row and return its latest state; `None` if the row does not exist.
/// With `skip_locked`, also `None` when another transaction holds it.
pub fn lock(client: &SpiClient<'_>, slot: Slot<'_>, skip_locked: bool) -> Option<State> {
    let sql = format!(
        "SELECT value, ts FROM rate_limiter.state WHERE {} FOR NO KEY UPDATE{}",
        slot_where(slot.key),
        if skip_locked { " SKIP LOCKED" } else { "" }
    );
    run(client, &sql, &SLOT_TYPES, &slot_args(slot), true, first_state)
}

/// Create a shard's row; false when a concurrent transaction created it first.
pub fn insert(client: &SpiClient<'_>, slot: Slot<'_>, state: State) -> bool {
    let sql = "INSERT INTO rate_limiter.state (name, key, shard, value, ts) \
               VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name, key, shard) DO NOTHING RETURNING true";
    let mut args = slot_args(slot);
    args.push(state.value.into());
    args.push(clock::ms_timestamptz(state.ts).into());
    run(client, sql, &[TEXT, TEXT, INT4, FLOAT8, TIMESTAMPTZ], &args, true, |t| !t.is_empty())
}

/// Write a shard's state; the caller holds its row lock.
pub fn update(client: &SpiClient<'_>, slot: Slot<'_>, state: State) {
    let sql = format!(
        "UPDATE rate_limiter.state SET value = $4, ts = $5 WHERE {}",
        slot_where(slot.key)
    );
    let mut args = slot_args(slot);
    args.push(state.value.into());
    args.push(clock::ms_timestamptz(state.ts).into());
    run(client, &sql, &[TEXT, TEXT, INT4, FLOAT8, TIMESTAMPTZ], &args, true, |_| ());
}

/// Forget every shard of (name, key).
pub fn delete(client: &SpiClient<'_>, name: &str, key: Option<&str>) {
    let key_where = match key {
        Some(_) => "key OPERATOR(pg_catalog.=) $2",
        None => "key IS NULL",
    };
    let sql = format!(
        "DELETE FROM rate_limiter.state WHERE name OPERATOR(pg_catalog.=) $1 AND {key_where}"
    );
    run(client, &sql, &[TEXT, TEXT], &[name.into(), key.into()], true, |_| ());
}

/// Insert or replace a named limit.
pub fn upsert_limit(client: &SpiClient<'_>, row: &LimitRow, name: &str) {
    let sql = "INSERT INTO rate_limiter.limits AS l \
               (name, kind, rate, period, capacity, max_reserved, shards, start) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
               ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, rate = excluded.rate, \
               period = excluded.period, capacity = excluded.capacity, \
               max_reserved = excluded.max_reserved, shards = excluded.shards, start = excluded.start";
    let types = [
        TEXT,
        TEXT,
        FLOAT8,
        PgOid::BuiltIn(PgBuiltInOids::INTERVALOID),
        FLOAT8,
        FLOAT8,
        INT4,
        TIMESTAMPTZ,
    ];
    let args: [DatumWithOid<'_>; 8] = [
        name.into(),
        row.kind.as_str().into(),
        row.rate.into(),
        row.period.into(),
        row.capacity.into(),
        row.max_reserved.into(),
        row.shards.into(),
        row.start.into(),
    ];
    run(client, sql, &types, &args, true, |_| ());
}
