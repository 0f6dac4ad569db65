//! The statistics views' functions (`_stats`, `_top_denied`), their every-database
//! counterparts for superusers and `pg_monitor` (`stats_every_database`,
//! `top_denied_every_database`) and `stats_reset`: VOLATILE (the counters move) and PARALLEL
//! RESTRICTED (their once-per-session NOTICE is the leader's).

use std::ffi::CStr;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{Datum, FunctionCallInfo};
use pgrx::prelude::*;

use crate::clock;
use crate::error::Error;
use crate::shmem::stats::{self, Scope};

use super::fmgr_v1_info;

thread_local! {
    static TOLD_STATS_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Without the shared area: say once per session how to get statistics.
fn stats_available() -> bool {
    if stats::enabled() {
        return true;
    }
    if !TOLD_STATS_OFF.replace(true) {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "rate_limiter statistics are off: the library is not in shared_preload_libraries",
            "rate_limiter",
        )
        .set_hint("Add rate_limiter to shared_preload_libraries in postgresql.conf and restart the server.")
        .report(PgLogLevel::NOTICE);
    }
    false
}

fn timestamptz(pg_us: i64) -> TimestampWithTimeZone {
    clock::ms_timestamptz(clock::pg_us_to_ms(pg_us))
}

/// One row of the statistics, as the views show it.
type StatsRow = (
    String,
    i64,
    i64,
    i64,
    f64,
    f64,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
    TimestampWithTimeZone,
    i64,
    i64,
);

fn stats_row(r: stats::Row) -> StatsRow {
    (
        r.name,
        r.calls,
        r.allowed,
        r.denied,
        r.tokens_granted,
        r.tokens_reserved,
        r.last_allowed_at.map(timestamptz),
        r.last_denied_at.map(timestamptz),
        timestamptz(r.stats_reset),
        r.shadow_denied,
        r.memory_in_rows,
    )
}

/// The rows of the view `rate_limiter.stats` (with `memory_in_rows` since 0.7.0, a symbol of
/// its own: 0.5.0's and 0.6.0's SQL names the one below, which says to update).
// pgrx reads the column names from the name! macros, so the type stays spelled out here.
#[allow(clippy::type_complexity)]
#[pg_extern(name = "_stats", volatile, parallel_restricted)]
fn stats_since_0_7_0() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(calls, i64),
        name!(allowed, i64),
        name!(denied, i64),
        name!(tokens_granted, f64),
        name!(tokens_reserved, f64),
        name!(last_allowed_at, Option<TimestampWithTimeZone>),
        name!(last_denied_at, Option<TimestampWithTimeZone>),
        name!(stats_reset, TimestampWithTimeZone),
        name!(shadow_denied, i64),
        name!(memory_in_rows, i64),
    ),
> {
    let rows = if stats_available() { stats::rows(Scope::ThisDatabase) } else { Vec::new() };
    TableIterator::new(rows.into_iter().map(stats_row))
}

/// The rows of the view `rate_limiter.top_denied`.
#[pg_extern(volatile, parallel_restricted)]
fn _top_denied() -> TableIterator<
    'static,
    (name!(name, String), name!(key, Option<String>), name!(denied, i64), name!(approximate_error, i64)),
> {
    let sketches = if stats_available() { stats::top_denied(Scope::ThisDatabase) } else { Vec::new() };
    TableIterator::new(sketches.into_iter().flat_map(|(_, name, heavy)| {
        heavy.into_iter().map(move |h| (name.clone(), h.key, h.count as i64, h.error as i64))
    }))
}

/// Zero the statistics of limit `name`, or of every name when NULL; returns how many rows
/// of `rate_limiter.stats` were reset.
#[pg_extern(volatile, parallel_restricted)]
fn stats_reset(name: default!(Option<&str>, "NULL")) -> i64 {
    if stats_available() { stats::reset(name) } else { 0 }
}

/// Every database's rows (superusers and members of `pg_monitor` only: names and keys of one
/// database are not another's to read), with the database's name; NULL for the row that
/// counts names no database had room for.
#[allow(clippy::type_complexity)]
#[pg_extern(name = "stats_every_database", volatile, parallel_restricted)]
fn stats_every_database_since_0_7_0() -> TableIterator<
    'static,
    (
        name!(database, Option<String>),
        name!(name, String),
        name!(calls, i64),
        name!(allowed, i64),
        name!(denied, i64),
        name!(tokens_granted, f64),
        name!(tokens_reserved, f64),
        name!(last_allowed_at, Option<TimestampWithTimeZone>),
        name!(last_denied_at, Option<TimestampWithTimeZone>),
        name!(stats_reset, TimestampWithTimeZone),
        name!(shadow_denied, i64),
        name!(memory_in_rows, i64),
    ),
> {
    require_monitor("stats_every_database()");
    let rows = if stats_available() { stats::rows(Scope::EveryDatabase) } else { Vec::new() };
    // Rows of databases dropped since are left out; entry 0 has no database.
    let rows = rows.into_iter().filter_map(|r| Some((of_database(r.database)?, r)));
    TableIterator::new(rows.map(|(database, r)| {
        let (name, calls, allowed, denied, granted, reserved, last_allowed, last_denied, reset, shadow, in_rows) = stats_row(r);
        (database, name, calls, allowed, denied, granted, reserved, last_allowed, last_denied, reset, shadow, in_rows)
    }))
}

/// The symbols of the statistics' functions before they had the columns of this version:
/// a database not yet updated is told to.
macro_rules! outdated {
    ($($info:ident $symbol:ident: $what:literal;)*) => {$(
        fmgr_v1_info!($info);

        #[doc = $what]
        ///
        /// # Safety
        /// None: it reads no argument and only raises.
        #[no_mangle]
        #[pg_guard]
        pub unsafe extern "C-unwind" fn $symbol(_fcinfo: FunctionCallInfo) -> Datum {
            Error::ExtensionOutdated.raise()
        }
    )*};
}

outdated! {
    pg_finfo_stats_since_0_5_0_wrapper stats_since_0_5_0_wrapper: "0.5.0's and 0.6.0's `_stats`, without `memory_in_rows`.";
    pg_finfo_stats_every_database_since_0_5_0_wrapper stats_every_database_since_0_5_0_wrapper: "0.5.0's and 0.6.0's `stats_every_database`, the same.";
}

fmgr_v1_info!(pg_finfo__stats_wrapper);

/// 0.4.0's `_stats`, without `shadow_denied`: a database not yet updated is told to.
///
/// # Safety
/// None: it reads no argument and only raises.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn _stats_wrapper(_fcinfo: FunctionCallInfo) -> Datum {
    Error::ExtensionOutdated.raise()
}

fmgr_v1_info!(pg_finfo_stats_every_database_wrapper);

/// 0.4.0's `stats_every_database`, the same.
///
/// # Safety
/// None: it reads no argument and only raises.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn stats_every_database_wrapper(_fcinfo: FunctionCallInfo) -> Datum {
    Error::ExtensionOutdated.raise()
}

/// Every database's most denied keys (superusers and members of `pg_monitor` only).
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_restricted)]
fn top_denied_every_database() -> TableIterator<
    'static,
    (
        name!(database, Option<String>),
        name!(name, String),
        name!(key, Option<String>),
        name!(denied, i64),
        name!(approximate_error, i64),
    ),
> {
    require_monitor("top_denied_every_database()");
    let sketches = if stats_available() { stats::top_denied(Scope::EveryDatabase) } else { Vec::new() };
    let sketches = sketches.into_iter().filter_map(|(database, name, heavy)| Some((of_database(database)?, name, heavy)));
    TableIterator::new(sketches.flat_map(|(database, name, heavy)| {
        heavy.into_iter().map(move |h| (database.clone(), name.clone(), h.key, h.count as i64, h.error as i64))
    }))
}

/// 42501 unless the current user is a superuser or has the privileges of `pg_monitor`
/// (membership with INHERIT, as PostgreSQL's own monitoring views require).
fn require_monitor(function: &str) {
    // SAFETY: reads this backend's current user and the role catalog's cache, inside the
    // calling transaction; neither keeps a pointer.
    let allowed = unsafe {
        let user = pg_sys::GetUserId();
        pg_sys::superuser_arg(user) || pg_sys::has_privs_of_role(user, pg_sys::Oid::from(pg_sys::ROLE_PG_MONITOR))
    };
    if !allowed {
        Error::NotAMonitor(format!("rate_limiter.{function}")).raise()
    }
}

/// The `database` column of a row: `Some(None)` for entry 0, which has none, the name of a
/// database that exists, or `None` (leave the row out) for one dropped since.
fn of_database(database: pg_sys::Oid) -> Option<Option<String>> {
    if database == pg_sys::InvalidOid {
        return Some(None);
    }
    // SAFETY: get_database_name takes any OID and returns a palloc'd NUL-terminated name, or
    // NULL for one that is gone (checked); the name is copied at once.
    unsafe {
        let name = pg_sys::get_database_name(database);
        (!name.is_null()).then(|| Some(CStr::from_ptr(name).to_string_lossy().into_owned()))
    }
}
