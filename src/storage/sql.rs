//! The plain SQL statements: forgetting state, pruning, the block and allow lists and
//! defining limits. Rare,
//! and not on the path of a decision; the executor keeps every index and publication
//! informed.


use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::cache::{self, List};
use crate::clock;
use crate::config::{LimitRow, Override};
use crate::error::Error;

use super::guard;
use super::spi;
use super::row::{key_is_second_param_sql, named_or_inline_sql};
use super::xact_snapshot_isolation;

// The plain SQL below runs in SECURITY DEFINER functions and in the prune worker: tables are
// named from their OIDs (`cache::qualified_name`) and every operator is qualified.

/// The name of `table`, which the statement to come writes with the owner's rights: locked
/// and refused if a trigger or rule was planted on it (`guard`).
fn written(table: pg_sys::Oid) -> String {
    guard::writable(table);
    cache::qualified_name(table)
}

/// The list's table, with the name of its unique constraint; None for the allow list of a
/// database whose extension is older than 0.4.0.
fn list_table(list: List) -> Option<(pg_sys::Oid, &'static str)> {
    let relations = cache::relations();
    match list {
        List::Blocks => Some((relations.blocks, "blocks_key_name_key")),
        List::Allows => relations.allows.map(|(table, _)| (table, "allows_key_name_key")),
    }
}

/// Forget every shard of (name, key), the named limit's and every inline config's. Plain
/// SQL: rare, and not on the path of a decision.
pub fn delete(name: &str, key: Option<&str>) {
    let key_where = key_is_second_param_sql(key);
    // The named limit's rows, and every inline config's (shards below 0).
    let sql = format!(
        "DELETE FROM {} WHERE {key_where} AND {}",
        written(cache::relations().state),
        named_or_inline_sql("shard OPERATOR(pg_catalog.<) 0 AND ")
    );
    Spi::run_with_args(&sql, &[name.into(), key.into()]).unwrap_or_else(|e| panic!("{sql}: {e}"));
    // A concurrency limit's leases, under every config; slots transactions hold stay theirs.
    if let Some(leases) = cache::relations().leases {
        let sql = format!("DELETE FROM {} WHERE {key_where} AND {}", written(leases), named_or_inline_sql(""));
        Spi::run_with_args(&sql, &[name.into(), key.into()]).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Delete up to `max_rows` rows whose expiry has passed at `now` (ms), then rows of named
/// limits that no longer exist, skipping rows other transactions hold; how many were
/// deleted. Plain SQL: the executor keeps every index and publication informed. The row
/// lock re-checks `expires` on the newest version, so a row a call has just written again
/// is kept.
pub fn prune(now: f64, max_rows: i32) -> i64 {
    let relations = cache::relations();
    // The limits first, as a TRUNCATE of them takes them before the tables below: prune then
    // waits for it, rather than hold a table that the TRUNCATE's trigger waits for while
    // waiting for the limits itself (a deadlock). AccessShare: a define does not wait.
    // SAFETY: locks a relation by the OID the cache resolved for this database, to the end of
    // the transaction, waited for as any lock is.
    unsafe { pg_sys::LockRelationOid(relations.limits, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
    let ended = [
        list_table(List::Blocks).map(|(table, _)| (table, "until")),
        list_table(List::Allows).map(|(table, _)| (table, "until")),
        // Overrides that ended: their keys are decided under their limits again.
        relations.overrides.map(|(table, _)| (table, "until")),
        // Leases that ended hold nothing any more.
        relations.leases.map(|t| (t, "expires_at")),
        // Memory limits' counts that equal an absent key's.
        relations.memory_snapshot.map(|t| (t, "expires")),
    ];
    let mut deleted = 0;
    for (table, until) in ended.into_iter().flatten() {
        deleted += delete_past(&written(table), until, now, max_rows - deleted as i32);
        if deleted == max_rows as i64 {
            return deleted;
        }
    }
    deleted + prune_state(now, max_rows - deleted as i32)
}

/// Delete up to `max_rows` rows of `table` whose `until` column has passed at `now`. The row
/// lock re-checks `until` on the newest version, so a row written again is kept.
fn delete_past(table: &str, until: &str, now: f64, max_rows: i32) -> i64 {
    let sql = format!(
        "WITH ended AS ( \
             SELECT ctid FROM {table} WHERE {until} OPERATOR(pg_catalog.<=) $2 \
             LIMIT $1 FOR UPDATE SKIP LOCKED) \
         DELETE FROM {table} \
         WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM ended)) \
           AND {until} OPERATOR(pg_catalog.<=) $2"
    );
    let now = clock::ms_timestamptz(now);
    Spi::connect_mut(|client| client.update(&sql, None, &[max_rows.into(), now.into()]).map(|t| t.len() as i64))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn prune_state(now: f64, max_rows: i32) -> i64 {
    // A hot limit's base row stays: the debit log is replayed over it, and a fresh state in
    // its place would count the log's older debits as if taken from a full limit.
    let not_hot = match cache::relations().debits {
        Some(_) => format!(
            " AND NOT EXISTS (SELECT FROM {} l WHERE l.name OPERATOR(pg_catalog.=) s.name AND l.hot)",
            cache::qualified_name(cache::relations().limits)
        ),
        None => String::new(),
    };
    let expired = delete_some(&format!("expires OPERATOR(pg_catalog.<=) $2{not_hot}"), clock::ms_timestamptz(now), max_rows);
    let left = max_rows - expired as i32;
    if left == 0 || !limits_held_still() {
        return expired;
    }
    let orphaned = format!(
        "shard OPERATOR(pg_catalog.>=) 0 AND $2::pg_catalog.bool AND NOT EXISTS \
         (SELECT FROM {} l WHERE l.name OPERATOR(pg_catalog.=) s.name)",
        cache::qualified_name(cache::relations().limits)
    );
    expired + delete_some(&orphaned, true, left)
}

/// Delete up to `max_rows` rows of `rate_limiter.state s` where `condition` (on `$2`) holds.
fn delete_some<'a>(condition: &str, arg: impl Into<pgrx::datum::DatumWithOid<'a>>, max_rows: i32) -> i64 {
    let state = written(cache::relations().state);
    let sql = format!(
        "WITH doomed AS ( \
             SELECT ctid FROM {state} s WHERE {condition} \
             LIMIT $1 FOR UPDATE SKIP LOCKED) \
         DELETE FROM {state} \
         WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM doomed))"
    );
    Spi::connect_mut(|client| client.update(&sql, None, &[max_rows.into(), arg.into()]).map(|t| t.len() as i64))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Whether the set of named limits is sure to stay as the next statement's snapshot sees
/// it until this transaction ends. Otherwise a limit deleted and created again while
/// prune() runs could lose the state written in between. Takes a SHARE lock on
/// `rate_limiter.limits` (held to the end of the transaction) without waiting; false when a
/// transaction is changing limits, or when the snapshot is the transaction's (REPEATABLE
/// READ, SERIALIZABLE), which may predate the lock.
fn limits_held_still() -> bool {
    let limits = cache::relations().limits;
    // SAFETY: locks a relation by the OID that the cache resolved for this database.
    !xact_snapshot_isolation() && unsafe { pg_sys::ConditionalLockRelationOid(limits, pg_sys::ShareLock as pg_sys::LOCKMODE) }
}

/// `IS NOT DISTINCT FROM` without an operator looked up by name (these run as SECURITY
/// DEFINER): `column` equals `$n`, or both are NULL.
fn same(column: &str, n: u8) -> String {
    format!("({column} OPERATOR(pg_catalog.=) ${n} OR ({column} IS NULL AND ${n}::pg_catalog.text IS NULL))")
}

/// The list's table (its name, as `written`), or 55000 for the allow list of a database not
/// yet updated.
fn list_table_or_outdated(list: List) -> (String, &'static str) {
    let (table, constraint) = list_table(list).unwrap_or_else(|| Error::ExtensionOutdated.raise());
    (written(table), constraint)
}

/// Insert or replace the block or allow of (name, key).
pub fn upsert_listed(list: List, name: Option<&str>, key: Option<&str>, until: TimestampWithTimeZone, note: Option<&str>) {
    let (table, constraint) = list_table_or_outdated(list);
    let sql = format!(
        "INSERT INTO {table} AS b (name, key, until, note) VALUES ($1, $2, $3, $4) \
         ON CONFLICT ON CONSTRAINT {constraint} DO UPDATE \
         SET until = excluded.until, note = excluded.note, created = pg_catalog.now()"
    );
    Spi::run_with_args(&sql, &[name.into(), key.into(), until.into(), note.into()]).unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Delete the block or allow of (name, key); whether there was one.
pub fn delete_listed(list: List, name: Option<&str>, key: Option<&str>) -> bool {
    let (table, _) = list_table_or_outdated(list);
    let sql = format!("DELETE FROM {table} WHERE {} AND {}", same("name", 1), same("key", 2));
    Spi::connect_mut(|client| client.update(&sql, None, &[name.into(), key.into()]).map(|t| !t.is_empty()))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `rate_limiter.overrides` (its name, as `written`), or 55000 in a database not yet updated
/// to 0.7.0.
fn overrides_or_outdated() -> String {
    let (table, _) = cache::relations().overrides.unwrap_or_else(|| Error::ExtensionOutdated.raise());
    written(table)
}

/// What an override or a tier sets: numbers (NULL: the limit's), and whether exempt.
fn numbers_args(numbers: &Override, exempt: bool) -> [DatumWithOid<'static>; 6] {
    [
        numbers.rate.into(),
        numbers.period.into(),
        numbers.capacity.into(),
        numbers.max_reserved.into(),
        numbers.min_gap.into(),
        exempt.into(),
    ]
}

/// Insert or replace the override of (name, key): a tier, or numbers of its own.
pub fn upsert_override(name: &str, key: Option<&str>, tier: Option<&str>, numbers: &Override, exempt: bool, until: TimestampWithTimeZone, note: Option<&str>) {
    let table = overrides_or_outdated();
    let sql = format!(
        "INSERT INTO {table} AS o (name, key, tier, rate, period, capacity, max_reserved, min_gap, exempt, until, note) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT ON CONSTRAINT overrides_name_key_key DO UPDATE \
         SET tier = excluded.tier, rate = excluded.rate, period = excluded.period, capacity = excluded.capacity, \
         max_reserved = excluded.max_reserved, min_gap = excluded.min_gap, exempt = excluded.exempt, \
         until = excluded.until, note = excluded.note, created = pg_catalog.now()"
    );
    let mut args: Vec<DatumWithOid<'_>> = vec![name.into(), key.into(), tier.into()];
    args.extend(numbers_args(numbers, exempt));
    args.extend([until.into(), note.into()]);
    Spi::run_with_args(&sql, &args).unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// `rate_limiter.tiers` (its name, as `written`), or 55000 in a database not yet updated to
/// 0.7.0.
fn tiers_or_outdated() -> String {
    let (table, _) = cache::relations().tiers.unwrap_or_else(|| Error::ExtensionOutdated.raise());
    written(table)
}

/// Insert or replace the tier `tier` of the limit `name`.
pub fn upsert_tier(name: &str, tier: &str, numbers: &Override, exempt: bool, note: Option<&str>) {
    let table = tiers_or_outdated();
    let sql = format!(
        "INSERT INTO {table} AS t (name, tier, rate, period, capacity, max_reserved, min_gap, exempt, note) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT ON CONSTRAINT tiers_pkey DO UPDATE \
         SET rate = excluded.rate, period = excluded.period, capacity = excluded.capacity, \
         max_reserved = excluded.max_reserved, min_gap = excluded.min_gap, exempt = excluded.exempt, \
         note = excluded.note, created = pg_catalog.now()"
    );
    let mut args: Vec<DatumWithOid<'_>> = vec![name.into(), tier.into()];
    args.extend(numbers_args(numbers, exempt));
    args.push(note.into());
    Spi::run_with_args(&sql, &args).unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Delete the tier `tier` of the limit `name`; whether there was one. (The tiers' trigger
/// refuses it while an override names it.)
pub fn delete_tier(name: &str, tier: &str) -> bool {
    let table = tiers_or_outdated();
    let sql = format!("DELETE FROM {table} WHERE name OPERATOR(pg_catalog.=) $1 AND tier OPERATOR(pg_catalog.=) $2");
    Spi::connect_mut(|client| client.update(&sql, None, &[name.into(), tier.into()]).map(|t| !t.is_empty()))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Lock the limit `name`'s row FOR SHARE, and its tier `tier`'s when given FOR KEY SHARE, to
/// the end of the transaction: a change of the limit (a DELETE, a rename, a `define` that
/// makes it hot) and a DELETE or rename of the tier wait for the override, and their triggers
/// then see it (they read the latest snapshot), so that none is left naming what is gone or
/// overriding what takes none.
pub fn hold_for_override(name: &str, tier: Option<&str>) {
    let relations = cache::relations();
    let limits = cache::qualified_name(relations.limits);
    let sql = format!("SELECT FROM {limits} WHERE name OPERATOR(pg_catalog.=) $1 FOR SHARE");
    Spi::run_with_args(&sql, &[name.into()]).unwrap_or_else(|e| panic!("{sql}: {e}"));
    if let (Some(tier), Some((tiers, _))) = (tier, relations.tiers) {
        let tiers = cache::qualified_name(tiers);
        let sql = format!("SELECT FROM {tiers} WHERE name OPERATOR(pg_catalog.=) $1 AND tier OPERATOR(pg_catalog.=) $2 FOR KEY SHARE");
        Spi::run_with_args(&sql, &[name.into(), tier.into()]).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Whether any override names a tier, in the latest snapshot (see `has_overrides_ending`).
pub fn overrides_naming_any_tier() -> bool {
    let Some((table, _)) = cache::relations().overrides else { return false };
    let sql = format!("SELECT FROM {} WHERE tier IS NOT NULL LIMIT 1", cache::qualified_name(table));
    let mut found = false;
    spi::run(table, &sql, &[], |_| found = true);
    found
}

/// How many overrides name the tier `tier` of the limit `name`, in the latest snapshot (see
/// `has_overrides_ending`).
pub fn overrides_naming(name: &str, tier: &str) -> i64 {
    let Some((table, _)) = cache::relations().overrides else { return 0 };
    let sql = format!(
        "SELECT pg_catalog.count(*) FROM {} WHERE name OPERATOR(pg_catalog.=) $1 AND tier OPERATOR(pg_catalog.=) $2",
        cache::qualified_name(table)
    );
    let mut naming = 0;
    spi::run(table, &sql, &[spi::text_arg(name), spi::text_arg(tier)], |row| naming = row.int8(1));
    naming
}

/// Delete the override of (name, key); whether there was one.
pub fn delete_override(name: &str, key: Option<&str>) -> bool {
    let table = overrides_or_outdated();
    let sql = format!("DELETE FROM {table} WHERE name OPERATOR(pg_catalog.=) $1 AND {}", same("key", 2));
    Spi::connect_mut(|client| client.update(&sql, None, &[name.into(), key.into()]).map(|t| !t.is_empty()))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Whether the limit `name` has an override with an end (`until`), committed now or written
/// by this transaction: read in the latest snapshot, so that an override() that committed
/// while a REPEATABLE READ change of the limit waited for its lock is seen, as a foreign
/// key's check sees it.
pub fn has_overrides_ending(name: &str) -> bool {
    let Some((table, _)) = cache::relations().overrides else { return false };
    let sql = format!(
        "SELECT FROM {} WHERE name OPERATOR(pg_catalog.=) $1 AND until OPERATOR(pg_catalog.<>) 'infinity'::pg_catalog.timestamptz LIMIT 1",
        cache::qualified_name(table)
    );
    let mut found = false;
    spi::run(table, &sql, &[spi::text_arg(name)], |_| found = true);
    found
}

/// The keys whose overrides name the tier `tier` of the limit `name`, in the latest snapshot
/// (see `has_overrides_ending`).
pub fn keys_in_tier(name: &str, tier: &str) -> Vec<Option<String>> {
    let Some((table, _)) = cache::relations().overrides else { return Vec::new() };
    let sql = format!(
        "SELECT key FROM {} WHERE name OPERATOR(pg_catalog.=) $1 AND tier OPERATOR(pg_catalog.=) $2",
        cache::qualified_name(table)
    );
    let mut keys = Vec::new();
    spi::run(table, &sql, &[spi::text_arg(name), spi::text_arg(tier)], |row| keys.push(row.text_or_null(1)));
    keys
}

/// The numbers every override in force (its own, not a tier's) and every tier of the limit
/// `name` give, in the latest snapshot (see `has_overrides_ending`): the overrides by key (bytes,
/// the NULL key first), then the tiers by name.
pub fn numbers_given(name: &str) -> Vec<Override> {
    let relations = cache::relations();
    let now = spi::ts_arg(clock::now_ms(), "now");
    let numbers = "rate, period, capacity, max_reserved, min_gap";
    let mut given = Vec::new();
    let mut read = |row: &spi::ResultRow| {
        given.push(Override {
            rate: row.float8_or_null(1),
            period: row.interval_or_null(2),
            capacity: row.float8_or_null(3),
            max_reserved: row.float8_or_null(4),
            min_gap: row.interval_or_null(5),
        })
    };
    if let Some((table, _)) = relations.overrides {
        let sql = format!(
            "SELECT {numbers} FROM {} WHERE name OPERATOR(pg_catalog.=) $1 AND tier IS NULL AND until OPERATOR(pg_catalog.>) $2 \
             ORDER BY key COLLATE \"C\" NULLS FIRST",
            cache::qualified_name(table)
        );
        spi::run(table, &sql, &[spi::text_arg(name), now], &mut read);
    }
    if let Some((table, _)) = relations.tiers {
        let sql = format!("SELECT {numbers} FROM {} WHERE name OPERATOR(pg_catalog.=) $1 ORDER BY tier COLLATE \"C\"", cache::qualified_name(table));
        spi::run(table, &sql, &[spi::text_arg(name)], &mut read);
    }
    given
}

/// Delete every override and tier of the limit `name` (`None`: of every limit), as the limit
/// goes: the overrides first, so that no tier they name is left named. In the latest
/// snapshot (see `has_overrides_ending`): none committed meanwhile is left behind.
pub fn delete_overrides_of(name: Option<&str>) {
    let relations = cache::relations();
    for (table, _) in [relations.overrides, relations.tiers].into_iter().flatten() {
        let sql = format!(
            "DELETE FROM {} WHERE $1::pg_catalog.text IS NULL OR name OPERATOR(pg_catalog.=) $1",
            cache::qualified_name(table)
        );
        spi::write(table, &sql, &[spi::text_opt(name)], |_| {});
    }
}

/// Insert or replace a named limit.
pub fn upsert_limit(row: &LimitRow, name: &str) {
    // A database not yet updated to 0.4.0 has no hot column (and `define` there never sets
    // it), one not yet updated to 0.5.0 no enforce and tz (every limit there is enforced, in
    // UTC), one not yet updated to 0.6.0 no durable (every limit there is).
    let with_hot = cache::relations().debits.is_some();
    let limits = super::Lookup::limits();
    let since_0_5_0 = limits.has(&super::shape::LIMITS_SINCE_0_5_0);
    let since_0_6_0 = limits.has(&super::shape::LIMITS_SINCE_0_6_0);
    let extra: Vec<&str> = [("hot", with_hot), ("enforce", since_0_5_0), ("tz", since_0_5_0), ("durable", since_0_6_0)]
        .iter()
        .filter(|c| c.1)
        .map(|c| c.0)
        .collect();
    let (mut columns, mut values, mut updates) = (String::new(), String::new(), String::new());
    for (i, column) in extra.iter().enumerate() {
        columns += &format!(", {column}");
        values += &format!(", ${}", 15 + i);
        updates += &format!(", {column} = excluded.{column}");
    }
    let sql = format!(
        "INSERT INTO {} AS l \
         (name, kind, rate, period, capacity, max_reserved, shards, start, min_gap, mode, buckets, \
          lock_timeout, on_lock_timeout, deny_cache{columns}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14{values}) \
         ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, rate = excluded.rate, \
         period = excluded.period, capacity = excluded.capacity, \
         max_reserved = excluded.max_reserved, shards = excluded.shards, start = excluded.start, \
         min_gap = excluded.min_gap, mode = excluded.mode, buckets = excluded.buckets, \
         lock_timeout = excluded.lock_timeout, on_lock_timeout = excluded.on_lock_timeout, \
         deny_cache = excluded.deny_cache{updates}",
        written(cache::relations().limits),
    );
    let mut args: Vec<pgrx::datum::DatumWithOid<'_>> = vec![
        name.into(),
        row.kind.as_str().into(),
        row.rate.into(),
        row.period.into(),
        row.capacity.into(),
        row.max_reserved.into(),
        row.shards.into(),
        row.start.into(),
        row.min_gap.into(),
        row.mode.as_str().into(),
        row.buckets.into(),
        row.lock_timeout.into(),
        row.on_lock_timeout.as_str().into(),
        row.deny_cache.into(),
    ];
    if with_hot {
        args.push(row.hot.into());
    }
    if since_0_5_0 {
        args.push(row.enforce.into());
        args.push(row.tz.as_deref().into());
    }
    if since_0_6_0 {
        args.push(row.durable.into());
    }
    Spi::run_with_args(&sql, &args).unwrap_or_else(|e| panic!("{sql}: {e}"));
}
