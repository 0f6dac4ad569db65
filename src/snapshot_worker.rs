//! The background workers that bound what a crash or a promotion loses of memory limits'
//! counts (docs/memory-limits.md, "Restarts and crashes"): with memory limits on, a launcher
//! wakes every `rate_limiter.memory_snapshot` and starts, for each database whose entries
//! changed and that has none, a worker that stays: every interval it writes the entries
//! changed since its last round to that database's `rate_limiter.memory_snapshot` table, one
//! transaction, then marks them saved. It ends when its database has had nothing to write
//! for `IDLE_ROUNDS` rounds, at a `DROP DATABASE` of it, and at shutdown. Nothing runs while
//! no memory limit is called, nor on a standby (its tables are the primary's).
//!
//! A worker per database that stays, rather than one per round (0.6.0): a round needs no
//! free worker slot, so a role that keeps `max_worker_processes` busy with parallel scans
//! cannot stop the snapshots once they run (F5); and one database's held lock delays only its
//! own worker, whose round skips a row another transaction holds rather than wait for it (F4).
//!
//! As the prune workers do, these run as the bootstrap superuser in databases other roles
//! own: `search_path` pinned, the extension found by catalog lookups, no SQL that names its
//! objects.

use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, DynamicBackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;

use crate::shmem::memory::{self, snapshot};
use crate::storage::snapshot::Kind;
use crate::worker::{start, start_in_database};
use crate::{clock, storage};
use crate::settings;


/// From `_PG_init`, when memory limits are on (`memory_keys` > 0 in a preloaded library).
pub fn register() {
    BackgroundWorkerBuilder::new("rate_limiter memory snapshot launcher")
        .set_type("rate_limiter memory snapshot launcher")
        .set_library("rate_limiter")
        .set_function("rate_limiter_memory_snapshot_launcher")
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

/// Rounds with nothing to write after which a database's worker ends (a minute at the
/// default interval), giving its worker slot back; the launcher starts another at its next
/// change.
const IDLE_ROUNDS: u32 = 60;

/// The interval, or an hour when off (0): look at the setting again then, or at the next reload.
fn interval() -> Duration {
    Duration::from_millis(match settings::MEMORY_SNAPSHOT.get() {
        0 => 3_600_000,
        ms => ms as u64,
    })
}

/// Wait `for_at_most`, taking in a reload; false at SIGTERM.
fn rest(for_at_most: Duration) -> bool {
    if !BackgroundWorker::wait_latch(Some(for_at_most)) {
        return false;
    }
    if BackgroundWorker::sighup_received() {
        // SAFETY: the worker's main loop, outside any signal handler and with no
        // transaction, is where ProcessConfigFile(PGC_SIGHUP) may run.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
    true
}

fn off() -> bool {
    settings::MEMORY_SNAPSHOT.get() == 0 || storage::in_recovery()
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn rate_limiter_memory_snapshot_launcher(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let mut running: Vec<(pg_sys::Oid, DynamicBackgroundWorker)> = Vec::new();
    while rest(interval()) {
        running.retain(|(_, worker)| !matches!(worker.pid(), Err(BackgroundWorkerStatus::Stopped | BackgroundWorkerStatus::PostmasterDied)));
        if off() {
            continue;
        }
        for database in snapshot::databases_changed(clock::now_ms()) {
            if running.iter().any(|(d, _)| *d == database) || memory::is_dropping(database) {
                continue;
            }
            if let Some(worker) = start("rate_limiter memory snapshot", "rate_limiter_memory_snapshot_database", database) {
                running.push((database, worker));
            }
        }
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn rate_limiter_memory_snapshot_database(arg: pg_sys::Datum) {
    // A reload wakes it; SIGTERM ends it (start_in_database).
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    if !start_in_database(arg) {
        return;
    }
    // SAFETY: written only while the worker connects, before this runs.
    let database = unsafe { pg_sys::MyDatabaseId };
    let Some(origin) = memory::snapshot_origin() else { return };
    let mut log = BackgroundWorker::transaction(|| {
        let (full, since) = storage::snapshot::size(origin);
        Log { origin, full: usize::try_from(full).unwrap_or(0), since: usize::try_from(since).unwrap_or(0) }
    });
    let mut idle = 0;
    // Woken at least every second, to see a DROP DATABASE of its database in time (that
    // waits 5 s for the sessions connected to it).
    let mut next = Instant::now() + interval();
    while idle < IDLE_ROUNDS && rest(next.saturating_duration_since(Instant::now()).min(Duration::from_secs(1))) {
        if memory::is_dropping(database) {
            break;
        }
        if Instant::now() < next {
            continue;
        }
        next = Instant::now() + interval();
        let written = if off() { 0 } else { round(&mut log) };
        idle = if written == 0 { idle + 1 } else { 0 };
    }
}

/// How many records the database's log holds: its last full copy's, and those written
/// since (a forget counts one).
struct Log {
    /// This cluster's rows of the log (`memory::snapshot_origin`).
    origin: i64,
    full: usize,
    since: usize,
}

impl Log {
    /// Whether the next round writes every key and drops the log before it: once the records
    /// since the last full copy outnumber it three to one. Each record written then costs
    /// at most a third of a record of copy, and a load reads at most four records a key.
    fn wants_full(&self) -> bool {
        self.since > self.full.saturating_mul(3).saturating_add(FULL_AFTER_AT_LEAST)
    }
}

/// Records since a full copy before the next, however small the copy.
const FULL_AFTER_AT_LEAST: usize = 1_000;

/// One round: this database's changed entries written (or all of them, for a full copy), in
/// one transaction, and marked saved once it committed; how many changed.
fn round(log: &mut Log) -> usize {
    let full = log.wants_full();
    let written = BackgroundWorker::transaction(|| {
        if !storage::snapshot::begin_round() {
            return None;
        }
        let now = clock::now_ms();
        let changed = snapshot::changed(now, full);
        let rows = snapshot::rows_of(&changed, now);
        let rows: Vec<(&[u8], usize, f64)> = rows.iter().map(|r| (r.bytes.as_slice(), r.keys, r.expires)).collect();
        let kind = if full { Kind::Full } else { Kind::Changed };
        // A round of nothing writes nothing; nor does a full copy of nothing delete anything
        // (a database not loaded since a crash copies nothing, and the log is its to load).
        // With no table to write (0.6.0's until the update), nothing is marked saved.
        (rows.is_empty() || storage::snapshot::write(log.origin, kind, &rows)).then_some(changed)
    });
    let Some(written) = written else { return 0 };
    // Committed: saved as of the copy (a change since is written at the next round).
    snapshot::mark_saved(&written);
    let changed = written.iter().filter(|c| c.was_changed()).count();
    if full {
        (log.full, log.since) = (written.len(), 0);
    } else {
        log.since += written.len();
    }
    debug1!(
        "rate_limiter: {} memory limit keys written to rate_limiter.memory_snapshot ({changed} changed{})",
        written.len(),
        if full { ", a full copy" } else { "" }
    );
    changed
}
