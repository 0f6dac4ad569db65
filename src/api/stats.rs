//! The statistics views' functions (`_stats`, `_top_denied`) and `stats_reset`: VOLATILE
//! (the counters move) and PARALLEL RESTRICTED (their once-per-session NOTICE is the
//! leader's).


use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::clock;
use crate::shmem::stats;



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

/// The rows of the view `rate_limiter.stats`.
// pgrx reads the column names from the name! macros, so the type stays spelled out here.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_restricted)]
fn _stats() -> TableIterator<
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
    ),
> {
    let rows = if stats_available() { stats::rows() } else { Vec::new() };
    TableIterator::new(rows.into_iter().map(|r| {
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
        )
    }))
}

/// The rows of the view `rate_limiter.top_denied`.
#[pg_extern(volatile, parallel_restricted)]
fn _top_denied() -> TableIterator<
    'static,
    (name!(name, String), name!(key, Option<String>), name!(denied, i64), name!(approximate_error, i64)),
> {
    let sketches = if stats_available() { stats::top_denied() } else { Vec::new() };
    TableIterator::new(sketches.into_iter().flat_map(|(name, heavy)| {
        heavy.into_iter().map(move |h| (name.clone(), h.key, h.count as i64, h.error as i64))
    }))
}

/// Zero the statistics of limit `name`, or of every name when NULL; returns how many rows
/// of `rate_limiter.stats` were reset.
#[pg_extern(volatile, parallel_restricted)]
fn stats_reset(name: default!(Option<&str>, "NULL")) -> i64 {
    if stats_available() { stats::reset(name) } else { 0 }
}
