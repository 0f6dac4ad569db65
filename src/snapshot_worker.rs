//! The background worker that bounds what a crash or a promotion loses of memory limits'
//! counts (docs/memory-limits.md, "Restarts and crashes"): with memory limits on, a
//! launcher wakes every `rate_limiter.memory_snapshot` and, for each database whose entries
//! changed since, starts a worker that writes them to that database's
//! `rate_limiter.memory_snapshot` table, one transaction, then marks them saved. Nothing
//! runs while no memory limit is called, nor on a standby (its tables are the primary's).
//!
//! As the prune workers do, these run as the bootstrap superuser in databases other roles
//! own: `search_path` pinned, the extension found by catalog lookups, no SQL that names its
//! objects, and one database's worker waited for at most one interval (at least 10 s).

use std::time::Duration;

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;

use crate::shmem::memory::snapshot;
use crate::worker::{run_in, start_in_database};
use crate::{clock, storage};

/// `rate_limiter.memory_snapshot`, in milliseconds; 0 turns the snapshots off.
static INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// From `_PG_init`, when memory limits are on (`memory_keys` > 0 in a preloaded library).
pub fn register() {
    GucRegistry::define_int_guc(
        c"rate_limiter.memory_snapshot",
        c"How often memory limits' changed counts are written to rate_limiter.memory_snapshot, which a crash or a promotion loads; 0 turns it off.",
        c"After a crash, a key of a memory limit may admit again at most what it admitted in the last interval (and the worker's round).",
        &INTERVAL,
        0,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    BackgroundWorkerBuilder::new("rate_limiter memory snapshot launcher")
        .set_type("rate_limiter memory snapshot launcher")
        .set_library("rate_limiter")
        .set_function("rate_limiter_memory_snapshot_launcher")
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn rate_limiter_memory_snapshot_launcher(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    loop {
        // Off (0): look at the setting again hourly, or at the next reload.
        let interval = Duration::from_millis(match INTERVAL.get() {
            0 => 3_600_000,
            ms => ms as u64,
        });
        if !BackgroundWorker::wait_latch(Some(interval)) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: the launcher's main loop, outside any signal handler and with no
            // transaction, is where ProcessConfigFile(PGC_SIGHUP) may run.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            continue;
        }
        // SAFETY: reads shared recovery state; this worker is attached to shared memory.
        if INTERVAL.get() == 0 || unsafe { pg_sys::RecoveryInProgress() } {
            continue;
        }
        let limit = interval.max(Duration::from_secs(10));
        for database in snapshot::databases_changed(clock::now_ms()) {
            let setting = "rate_limiter.memory_snapshot (at least 10 s)";
            if !run_in("rate_limiter memory snapshot", "rate_limiter_memory_snapshot_database", database, limit, setting) {
                return;
            }
        }
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn rate_limiter_memory_snapshot_database(arg: pg_sys::Datum) {
    if !start_in_database(arg) {
        return;
    }
    let written = BackgroundWorker::transaction(|| {
        if !storage::snapshot::begin_round() {
            return Vec::new();
        }
        let changed = snapshot::changed(clock::now_ms());
        let rows: Vec<(&[u8], &[u8], f64)> =
            changed.iter().map(|c| (c.record.name.as_slice(), c.record.counts.as_slice(), c.record.expires)).collect();
        if storage::snapshot::write(&rows) { changed } else { Vec::new() }
    });
    // Committed: saved as of the copy (a change since is written at the next round).
    snapshot::mark_saved(&written);
    debug1!("rate_limiter: {} memory limit keys written to rate_limiter.memory_snapshot", written.len());
}
