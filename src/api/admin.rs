//! What changes limits, lists and state: `define`, `block`, `unblock`, `allow`, `disallow`,
//! `override`, `remove_override`, `define_tier`, `remove_tier`, `reset_rate_limit` and `prune`, each SECURITY DEFINER with its search_path pinned (their SQL names tables by
//! OID and qualifies every operator, see `storage`); and the entry points older versions'
//! SQL names, which say to update.

use pgrx::pg_sys::{Datum, FunctionCallInfo};
use pgrx::prelude::*;

use crate::bucket::{Config, Kind};
use crate::cache::List;
use crate::clock;
use crate::config::{self, LimitRow};
use crate::error::{self, Error, Result};
use crate::limiter;
use crate::overrides;
use crate::shmem::deny_cache;
use crate::storage;

use super::{fmgr_v1_info, valid_key, valid_name};


/// Forget the state of (name, key), every shard.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn reset_rate_limit(name: Option<&str>, key: default!(Option<&str>, "NULL")) {
    storage::prevent_writes_unless_allowed(c"reset_rate_limit()");
    let name = valid_name(name).unwrap_or_else(|e| e.raise());
    if storage::load_limit(name).is_some_and(|row| row.hot) {
        limiter::hot::reset(name, key);
    }
    limiter::memory::reset(name, key);
    storage::delete(name, key);
    deny_cache::forget_pair(name, key);
}

/// Deny `name`'s `key` (every limit's when `name` is NULL) until `until`, with `note`.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn block(
    name: Option<&str>,
    key: Option<&str>,
    until: default!(Option<TimestampWithTimeZone>, "'infinity'"),
    note: default!(Option<&str>, "NULL"),
) {
    storage::prevent_writes_unless_allowed(c"block()");
    list(List::Blocks, name, key, until, note)
}

/// Lift the block of (`name`, `key`); whether there was one.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn unblock(name: Option<&str>, key: Option<&str>) -> bool {
    storage::prevent_writes_unless_allowed(c"unblock()");
    storage::delete_listed(List::Blocks, name, key)
}

/// Never limit `name`'s `key` (every limit's when `name` is NULL) until `until`, with `note`.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn allow(
    name: Option<&str>,
    key: Option<&str>,
    until: default!(Option<TimestampWithTimeZone>, "'infinity'"),
    note: default!(Option<&str>, "NULL"),
) {
    storage::prevent_writes_unless_allowed(c"allow()");
    list(List::Allows, name, key, until, note)
}

/// Lift the allow of (`name`, `key`); whether there was one.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn disallow(name: Option<&str>, key: Option<&str>) -> bool {
    storage::prevent_writes_unless_allowed(c"disallow()");
    storage::delete_listed(List::Allows, name, key)
}

/// Put (name, key) on `list` until `until`, checked as every name and key is.
fn list(list: List, name: Option<&str>, key: Option<&str>, until: Option<TimestampWithTimeZone>, note: Option<&str>) {
    (|| -> Result<()> {
        let name = name.map(|n| valid_name(Some(n))).transpose()?;
        let key = valid_key(key)?;
        let until = until.ok_or_else(|| Error::InvalidArgument("until must not be NULL; use 'infinity'".into()))?;
        storage::upsert_listed(list, name, key, until, note);
        Ok(())
    })()
    .unwrap_or_else(|e| e.raise())
}

/// Give `name`'s `key` numbers of its own (`define`'s names; NULL: the limit's), or a tier's,
/// or exempt it, until `until`, with `note`. Its count is kept: a call on the key is judged
/// under the new numbers as under a redefined limit. Refused for a limit or tier that does
/// not exist, numbers the limit's kind could not have, and an end (`until`) for a hot, memory
/// or concurrency limit.
#[pg_extern(name = "override", security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::too_many_arguments)]
fn set_override(
    name: Option<&str>,
    key: Option<&str>,
    rate: default!(Option<f64>, "NULL"),
    period: default!(Option<Interval>, "NULL"),
    capacity: default!(Option<f64>, "NULL"),
    max_reserved: default!(Option<f64>, "NULL"),
    min_gap: default!(Option<Interval>, "NULL"),
    exempt: default!(Option<bool>, false),
    tier: default!(Option<&str>, "NULL"),
    until: default!(Option<TimestampWithTimeZone>, "'infinity'"),
    note: default!(Option<&str>, "NULL"),
) {
    storage::prevent_writes_unless_allowed(c"override()");
    (|| -> Result<()> {
        let name = valid_name(name)?;
        let key = valid_key(key)?;
        let exempt = exempt.ok_or_else(|| Error::InvalidArgument("exempt must not be NULL".into()))?;
        let until = until.ok_or_else(|| Error::InvalidArgument("until must not be NULL; use 'infinity'".into()))?;
        let numbers = config::Override { rate, period, capacity, max_reserved, min_gap };
        storage::hold_for_override(name, tier);
        let config = overrides::applied(name, &numbers)?;
        let no_end = config::no_end_for(config.kind == Kind::Concurrency, config.hot, config.durable);
        if let Some(which) = no_end.filter(|_| clock::timestamptz_ms(until) != f64::INFINITY) {
            return Err(Error::NotSupported(format!(
                "an override of the {which} limit \"{name}\" with an end: remove_override() it when it is to end"
            )));
        }
        if let Some(tier) = tier {
            if numbers != config::Override::default() || exempt {
                return Err(Error::InvalidArgument("an override names a tier or gives numbers (or exempt), not both".into()));
            }
            let (tier_numbers, _) =
                storage::load_tier(name, tier).ok_or_else(|| Error::UnknownTier { name: name.to_owned(), tier: tier.to_owned() })?;
            overrides::applied(name, &tier_numbers)?;
        }
        storage::upsert_override(name, key, tier, &numbers, exempt, until, note);
        Ok(())
    })()
    .unwrap_or_else(|e| e.raise())
}

/// Define or replace the tier `tier` of the limit `name`: numbers (`define`'s names; NULL: the
/// limit's), or exempt, that each override naming the tier gives its key, with `note`. A
/// change reaches every key in the tier, each judged under the new numbers with its count kept.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::too_many_arguments)]
fn define_tier(
    name: Option<&str>,
    tier: Option<&str>,
    rate: default!(Option<f64>, "NULL"),
    period: default!(Option<Interval>, "NULL"),
    capacity: default!(Option<f64>, "NULL"),
    max_reserved: default!(Option<f64>, "NULL"),
    min_gap: default!(Option<Interval>, "NULL"),
    exempt: default!(Option<bool>, false),
    note: default!(Option<&str>, "NULL"),
) {
    storage::prevent_writes_unless_allowed(c"define_tier()");
    (|| -> Result<()> {
        let name = valid_name(name)?;
        let tier = valid_tier(tier)?;
        let exempt = exempt.ok_or_else(|| Error::InvalidArgument("exempt must not be NULL".into()))?;
        let numbers = config::Override { rate, period, capacity, max_reserved, min_gap };
        storage::hold_for_override(name, None);
        overrides::applied(name, &numbers)?;
        storage::upsert_tier(name, tier, &numbers, exempt, note);
        Ok(())
    })()
    .unwrap_or_else(|e| e.raise())
}

/// Remove the tier `tier` of the limit `name`; whether there was one. Refused while an
/// override names it.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn remove_tier(name: Option<&str>, tier: Option<&str>) -> bool {
    storage::prevent_writes_unless_allowed(c"remove_tier()");
    (|| -> Result<bool> {
        let name = valid_name(name)?;
        let tier = valid_tier(tier)?;
        Ok(storage::delete_tier(name, tier))
    })()
    .unwrap_or_else(|e| e.raise())
}

/// A tier's name: a non-empty text of at most 128 bytes, as a limit's.
fn valid_tier(tier: Option<&str>) -> Result<&str> {
    match tier {
        Some(t) if !t.is_empty() && t.len() <= 128 => Ok(t),
        _ => Err(Error::InvalidArgument("tier must be a non-empty text of at most 128 bytes".into())),
    }
}

/// Take back the override of (`name`, `key`); whether there was one. The key is judged
/// under its limit's numbers again, its count kept.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn remove_override(name: Option<&str>, key: Option<&str>) -> bool {
    storage::prevent_writes_unless_allowed(c"remove_override()");
    let name = valid_name(name).unwrap_or_else(|e| e.raise());
    let key = valid_key(key).unwrap_or_else(|e| e.raise());
    storage::delete_override(name, key)
}

/// Delete up to `max_rows` rows of `rate_limiter.state` that hold what a fresh state would
/// (for named and inline limits alike), or belong to named limits that no longer exist,
/// and blocks that have ended; returns how many. Skips rows that running
/// transactions hold, so it never waits for them and can run beside calls and itself.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn prune(max_rows: default!(Option<i32>, 10000)) -> i64 {
    storage::prevent_writes_unless_allowed(c"prune()");
    match max_rows {
        Some(n) if n >= 0 => storage::prune(clock::now_ms(), n),
        other => Error::InvalidArgument(format!("max_rows must be >= 0, not {other:?}")).raise(),
    }
}

/// Create or replace a named limit (an upsert into `rate_limiter.limits`). Its C symbol is
/// new in 0.6.0, which added `durable`: the SQL of 0.2.0 to 0.5.0 names `define_wrapper`,
/// `define_limit_wrapper`, `define_since_0_4_0_wrapper` and `define_since_0_5_0_wrapper`
/// (see below).
#[pg_extern(name = "define", security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::too_many_arguments)]
fn define_since_0_6_0(
    name: Option<&str>,
    kind: Option<&str>,
    rate: Option<f64>,
    period: Option<Interval>,
    capacity: default!(Option<f64>, "NULL"),
    max_reserved: default!(Option<f64>, "NULL"),
    shards: default!(Option<i32>, 1),
    start: default!(Option<TimestampWithTimeZone>, "NULL"),
    min_gap: default!(Option<Interval>, "NULL"),
    mode: default!(Option<&str>, "'all'"),
    buckets: default!(Option<i32>, "NULL"),
    lock_timeout: default!(Option<Interval>, "NULL"),
    on_lock_timeout: default!(Option<&str>, "'deny'"),
    deny_cache: default!(Option<Interval>, "NULL"),
    hot: default!(Option<bool>, false),
    enforce: default!(Option<bool>, true),
    tz: default!(Option<&str>, "NULL"),
    durable: default!(Option<bool>, true),
) {
    storage::prevent_writes_unless_allowed(c"define()");
    let result = (|| -> Result<()> {
        let name = valid_name(name)?;
        let required = |what: &str| Error::InvalidConfig(format!("{what} must not be NULL"));
        let row = LimitRow {
            kind: kind.ok_or_else(|| required("kind"))?.to_owned(),
            rate: rate.ok_or_else(|| required("rate"))?,
            period: period.ok_or_else(|| required("period"))?,
            capacity,
            max_reserved,
            shards: shards.ok_or_else(|| required("shards"))?,
            start,
            min_gap,
            mode: mode.ok_or_else(|| required("mode"))?.to_owned(),
            buckets,
            lock_timeout,
            on_lock_timeout: on_lock_timeout.ok_or_else(|| required("on_lock_timeout"))?.to_owned(),
            deny_cache,
            hot: hot.ok_or_else(|| required("hot"))?,
            enforce: enforce.ok_or_else(|| required("enforce"))?,
            tz: tz.map(str::to_owned),
            durable: durable.ok_or_else(|| required("durable"))?,
        };
        // Validate here for a clear message; the table's CHECK constraints are the backstop.
        Config::try_from(&row)?;
        storage::upsert_limit(&row, name);
        overrides::fit(name, &row)
    })();
    result.unwrap_or_else(|e| e.raise())
}

/// `define` of 0.5.0, which has no `durable`, for a database not yet updated: the same,
/// durable. No SQL: 0.5.0's script declares it.
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments)]
fn define_since_0_5_0(
    name: Option<&str>,
    kind: Option<&str>,
    rate: Option<f64>,
    period: Option<Interval>,
    capacity: Option<f64>,
    max_reserved: Option<f64>,
    shards: Option<i32>,
    start: Option<TimestampWithTimeZone>,
    min_gap: Option<Interval>,
    mode: Option<&str>,
    buckets: Option<i32>,
    lock_timeout: Option<Interval>,
    on_lock_timeout: Option<&str>,
    deny_cache: Option<Interval>,
    hot: Option<bool>,
    enforce: Option<bool>,
    tz: Option<&str>,
) {
    define_since_0_6_0(
        name, kind, rate, period, capacity, max_reserved, shards, start, min_gap, mode, buckets, lock_timeout,
        on_lock_timeout, deny_cache, hot, enforce, tz, Some(true),
    )
}

/// `define` of 0.4.0, which has no `enforce` and `tz`, for a database not yet updated: the
/// same, enforced, in UTC. No SQL: 0.4.0's script declares it.
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments)]
fn define_since_0_4_0(
    name: Option<&str>,
    kind: Option<&str>,
    rate: Option<f64>,
    period: Option<Interval>,
    capacity: Option<f64>,
    max_reserved: Option<f64>,
    shards: Option<i32>,
    start: Option<TimestampWithTimeZone>,
    min_gap: Option<Interval>,
    mode: Option<&str>,
    buckets: Option<i32>,
    lock_timeout: Option<Interval>,
    on_lock_timeout: Option<&str>,
    deny_cache: Option<Interval>,
    hot: Option<bool>,
) {
    define_since_0_5_0(
        name, kind, rate, period, capacity, max_reserved, shards, start, min_gap, mode, buckets, lock_timeout,
        on_lock_timeout, deny_cache, hot, Some(true), None,
    )
}

/// `define` of 0.3.0, which has no `hot`, for a database not yet updated: the same, never
/// hot. No SQL: 0.3.0's script declares it (its symbol is `define_limit_wrapper`).
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments)]
fn define_limit(
    name: Option<&str>,
    kind: Option<&str>,
    rate: Option<f64>,
    period: Option<Interval>,
    capacity: Option<f64>,
    max_reserved: Option<f64>,
    shards: Option<i32>,
    start: Option<TimestampWithTimeZone>,
    min_gap: Option<Interval>,
    mode: Option<&str>,
    buckets: Option<i32>,
    lock_timeout: Option<Interval>,
    on_lock_timeout: Option<&str>,
    deny_cache: Option<Interval>,
) {
    define_since_0_4_0(
        name, kind, rate, period, capacity, max_reserved, shards, start, min_gap, mode, buckets, lock_timeout,
        on_lock_timeout, deny_cache, Some(false),
    )
}

fmgr_v1_info!(pg_finfo_decide_wrapper);

/// 0.1.0's `_decide`: its SQL names this symbol, so a database still on 0.1.0 can load this
/// library (and be updated); a call says what to do.
///
/// # Safety
/// None: it reads no argument and only raises.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn decide_wrapper(_fcinfo: FunctionCallInfo) -> Datum {
    error::Error::ExtensionOutdated.raise()
}

fmgr_v1_info!(pg_finfo_define_wrapper);

/// `define` of 0.1.0 and 0.2.0, which had fewer arguments: the same, for a database not yet
/// updated.
///
/// # Safety
/// None: it reads no argument and only raises.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn define_wrapper(_fcinfo: FunctionCallInfo) -> Datum {
    error::Error::ExtensionOutdated.raise()
}
