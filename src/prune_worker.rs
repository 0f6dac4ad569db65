//! The background worker that keeps `rate_limiter.state` from only growing: with
//! `shared_preload_libraries = 'rate_limiter'`, a launcher wakes every
//! `rate_limiter.prune_interval` and, one database at a time, starts a worker that prunes
//! that database's state table in batches if the extension is installed there, resting
//! between batches as long as each took, then vacuums it when it deleted anything.
//!
//! The workers run as the bootstrap superuser in databases that other roles own: they pin
//! `search_path` to `pg_catalog, pg_temp` first, find the extension by catalog lookups and
//! call the pruning code directly, never through SQL that names the extension's objects.
//!
//! No database can hold the others back: a worker sets its own vacuum cost, lock and
//! statement settings over the database's (`ALTER DATABASE ... SET vacuum_cost_delay`),
//! skips a state table another transaction holds locked (`VACUUM (SKIP_LOCKED)`, a
//! `lock_timeout` for the rest), ends when terminated, and the launcher waits at most one
//! interval for each database's worker before it terminates it and goes on. (0.4.0 waited
//! for each without a bound: one database owner's `BEGIN; ANALYZE rate_limiter.state;` left
//! open stopped pruning in every database, and `pg_terminate_backend` did not end a worker
//! in a vacuum's cost delay.)

use std::ffi::CString;
use std::time::Duration;

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;
use pgrx::PgMemoryContexts;

use crate::worker::{pin_search_path, run_in, start_in_database};
use crate::{cache, clock, storage};
use crate::settings;


/// Rows deleted per transaction: short transactions, so the worker never holds many row
/// locks or a snapshot for long.
const BATCH: i32 = 10_000;

/// From `_PG_init`: the launcher, when preloaded.
pub fn register() {
    // SAFETY: a plain bool the postmaster sets only while loading shared_preload_libraries;
    // this process is single-threaded, so no write can race this read.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        BackgroundWorkerBuilder::new("rate_limiter prune launcher")
            .set_type("rate_limiter prune launcher")
            .set_library("rate_limiter")
            .set_function("rate_limiter_prune_launcher")
            .enable_spi_access()
            .set_restart_time(Some(Duration::from_secs(10)))
            .load();
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn rate_limiter_prune_launcher(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(Some("postgres"), None);
    pin_search_path();
    loop {
        // Off (0): look at the setting again hourly, or at the next reload.
        let interval = match settings::PRUNE_INTERVAL.get() {
            0 => 3600,
            seconds => seconds as u64,
        };
        if !BackgroundWorker::wait_latch(Some(Duration::from_secs(interval))) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: the launcher's main loop, between transactions and outside any signal
            // handler, is where ProcessConfigFile(PGC_SIGHUP) may run, as PostgreSQL's own
            // workers call it.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            continue; // start the new interval afresh
        }
        if settings::PRUNE_INTERVAL.get() == 0 {
            continue;
        }
        let databases: Vec<pg_sys::Oid> = BackgroundWorker::transaction(|| {
            Spi::connect(|client| {
                client
                    .select("SELECT oid FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate", None, &[])
                    .map(|rows| rows.filter_map(|row| row.get::<pg_sys::Oid>(1).ok().flatten()).collect())
            })
            .unwrap_or_default()
        });
        for database in databases {
            if BackgroundWorker::sigterm_received()
                || !run_in("rate_limiter prune", "rate_limiter_prune_database", database, Duration::from_secs(interval), "rate_limiter.prune_interval")
            {
                return;
            }
        }
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn rate_limiter_prune_database(arg: pg_sys::Datum) {
    if !start_in_database(arg) {
        return;
    }
    let mut total = 0i64;
    loop {
        check_for_interrupts!();
        let started = std::time::Instant::now();
        // What rate_limiter.prune() does, called directly: the tables are found through the
        // extension's membership (see `cache`), so there is no function name to resolve.
        let deleted = BackgroundWorker::transaction(|| storage::prune(clock::now_ms(), BATCH));
        total += deleted;
        if deleted < i64::from(BATCH) {
            break;
        }
        // Rest as long as the batch took: a backlog is worked off at half a core at most,
        // leaving the rest to the calls.
        clock::sleep_ms(started.elapsed().as_secs_f64() * 1000.0);
    }
    if total > 0 {
        vacuum_state();
    }
    debug1!("rate_limiter: pruned {total} expired rows of rate_limiter.state");
}

/// `VACUUM` of the extension's state table, found by OID: pruned rows are dead tuples until
/// a vacuum makes their space reusable, and autovacuum may be a minute away; without it, a
/// table whose every call brings a new key grows by what is written between two autovacuum
/// runs.
fn vacuum_state() {
    let (state, name) = BackgroundWorker::transaction(|| {
        let state = cache::relations().state;
        // SKIP_LOCKED: a transaction that holds the table (an owner's ANALYZE left open) makes
        // this vacuum wait for the next round, not for it.
        (state, CString::new(format!("VACUUM (SKIP_LOCKED) {}", cache::qualified_name(state))).expect("no NUL in names"))
    });
    // Parse tree and vacuum's own memory live in a portal context, as for a command from a
    // client: VACUUM commits and starts transactions as it goes.
    let mut portal = PgMemoryContexts::new("rate_limiter vacuum");
    // SAFETY: as PostgresMain runs a utility command outside a transaction block: inside a
    // transaction command, with PortalContext set; ExecVacuum ends that transaction and
    // starts a new one, which we commit. The parse tree is allocated in `portal`, which
    // outlives those transactions and is deleted on drop after PortalContext is restored.
    // The statement's one relation is given by OID, which vacuum then uses instead of the
    // name (the name only labels its messages).
    unsafe {
        pg_sys::StartTransactionCommand();
        let (statement, pstate) = portal.switch_to(|_| {
            let parsed = pg_sys::raw_parser(name.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
            let raw = (*(*parsed).elements).ptr_value as *mut pg_sys::RawStmt;
            let statement = (*raw).stmt as *mut pg_sys::VacuumStmt;
            let relation = (*(*(*statement).rels).elements).ptr_value as *mut pg_sys::VacuumRelation;
            (*relation).oid = state;
            (statement, pg_sys::make_parsestate(std::ptr::null_mut()))
        });
        let _portal_set = PortalContextSet::to(portal.value());
        pg_sys::ExecVacuum(pstate, statement, true);
        pg_sys::CommitTransactionCommand();
    }
}

/// `PortalContext` set to a context of ours until dropped, then restored (before the
/// context itself is deleted: declared after it, so dropped first).
struct PortalContextSet(pg_sys::MemoryContext);

impl PortalContextSet {
    fn to(context: pg_sys::MemoryContext) -> PortalContextSet {
        // SAFETY: a backend-global pointer, read and set by this single-threaded process;
        // the previous value is restored on drop.
        unsafe {
            let previous = pg_sys::PortalContext;
            pg_sys::PortalContext = context;
            PortalContextSet(previous)
        }
    }
}

impl Drop for PortalContextSet {
    fn drop(&mut self) {
        // SAFETY: restores the value `to` found, once.
        unsafe { pg_sys::PortalContext = self.0 }
    }
}
