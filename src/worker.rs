//! What the background workers share: a database's worker started and waited for with a
//! bound, its start (connected, settings of its own over the database's, the extension
//! found), and those settings.

use std::time::Duration;

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, DynamicBackgroundWorker};
use pgrx::prelude::*;

use crate::storage;

/// Run `function` of this library as a worker of type `kind` connected to `database`, and
/// wait for it at most `limit`, which `setting` gives (see `wait_for`). False when this
/// launcher was terminated.
pub fn run_in(kind: &str, function: &str, database: pg_sys::Oid, limit: Duration, setting: &str) -> bool {
    match start(kind, function, database) {
        Some(worker) => wait_for(worker, limit, kind, setting),
        None => true,
    }
}

/// Start `function` of this library as a worker of type `kind` connected to `database`,
/// with this process to be told when it ends; None (logged) when no worker slot is free.
pub fn start(kind: &str, function: &str, database: pg_sys::Oid) -> Option<DynamicBackgroundWorker> {
    let started = BackgroundWorkerBuilder::new(kind)
        .set_type(kind)
        .set_library("rate_limiter")
        .set_function(function)
        .set_argument(database.into_datum())
        .enable_spi_access()
        // SAFETY: MyProcPid is set once at process start, before this entry point runs, and
        // never written again; the process is single-threaded.
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic();
    started.map_err(|e| log!("rate_limiter: could not start a {kind} worker: {e:?}")).ok()
}

/// The start of a database's worker, whose argument `arg` is the database's OID: it ends at
/// SIGTERM, connects, pins `search_path` and its own settings (it is a superuser in a
/// database another role may own). Whether the extension is installed there.
pub fn start_in_database(arg: pg_sys::Datum) -> bool {
    // SAFETY: the start of this worker, before it connects.
    unsafe { storage::die_on_sigterm() };
    // SAFETY: the launcher passed a database OID as the argument.
    let database = unsafe { pg_sys::Oid::from_datum(arg, false) }.expect("a database OID");
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(database), None);
    pin_search_path();
    own_settings();
    // SAFETY: inside the transaction BackgroundWorker::transaction starts, as the catalog scan
    // needs; with missing_ok it returns InvalidOid rather than raise. No SQL, so no name
    // resolves through another role's schemas.
    BackgroundWorker::transaction(|| unsafe { pg_sys::get_extension_oid(c"rate_limiter".as_ptr(), true) != pg_sys::InvalidOid })
}

/// Wait for a database's worker to end, at most `limit`; then terminate it and wait for that
/// (it ends at its next interrupt check). False when the launcher itself was terminated.
fn wait_for(worker: DynamicBackgroundWorker, limit: Duration, kind: &str, setting: &str) -> bool {
    use pgrx::bgworkers::BackgroundWorkerStatus::{PostmasterDied, Stopped};
    let deadline = std::time::Instant::now() + limit;
    // Not yet started counts as running: the postmaster forks it after this registered it.
    while !matches!(worker.pid(), Err(Stopped | PostmasterDied)) {
        if std::time::Instant::now() >= deadline {
            log!("{kind}: a worker ran past {setting}; terminating it");
            let _ = worker.terminate().wait_for_shutdown();
            return true;
        }
        // Woken early by the worker's end (the launcher is its notify_pid).
        if !BackgroundWorker::wait_latch(Some(Duration::from_millis(250))) {
            return false;
        }
    }
    true
}

/// `search_path = pg_catalog, pg_temp` for this worker's session, over whatever the
/// database's or role's settings made it: the worker runs as a superuser in databases that
/// other roles own, so nothing it runs may resolve a name through their schemas.
pub fn pin_search_path() {
    set(c"search_path", c"pg_catalog, pg_temp");
}

/// The worker's own cost and waits, over the database's settings: its owner may not slow it
/// (`vacuum_cost_delay`), nor make it wait on a lock for long or give up at once.
pub fn own_settings() {
    set(c"vacuum_cost_delay", c"0");
    set(c"lock_timeout", c"5s");
    set(c"statement_timeout", c"0");
    set(c"idle_in_transaction_session_timeout", c"0");
    // A snapshot marked saved once committed must be durable then, whatever the database's
    // or role's setting.
    set(c"synchronous_commit", c"on");
}

fn set(name: &std::ffi::CStr, value: &std::ffi::CStr) {
    // SAFETY: both strings are NUL-terminated and live through the call; the worker runs as
    // the bootstrap superuser, so PGC_SUSET is a context it holds, and a bad value would
    // raise, not corrupt.
    unsafe {
        pg_sys::SetConfigOption(name.as_ptr(), value.as_ptr(), pg_sys::GucContext::PGC_SUSET, pg_sys::GucSource::PGC_S_OVERRIDE);
    }
}

