//! What the background workers share: settings of their own over a database's, and a bounded
//! wait for a database's worker.

use std::time::Duration;

use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;

/// Wait for a database's worker to end, at most `limit`; then terminate it and wait for that
/// (it ends at its next interrupt check). False when the launcher itself was terminated.
pub fn wait_for(worker: pgrx::bgworkers::DynamicBackgroundWorker, limit: Duration) -> bool {
    use pgrx::bgworkers::BackgroundWorkerStatus::{PostmasterDied, Stopped};
    let deadline = std::time::Instant::now() + limit;
    // Not yet started counts as running: the postmaster forks it after this registered it.
    while !matches!(worker.pid(), Err(Stopped | PostmasterDied)) {
        if std::time::Instant::now() >= deadline {
            log!("rate_limiter: a worker ran past its time ({limit:?}); terminating it");
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
}

fn set(name: &std::ffi::CStr, value: &std::ffi::CStr) {
    // SAFETY: both strings are NUL-terminated and live through the call; the worker runs as
    // the bootstrap superuser, so PGC_SUSET is a context it holds, and a bad value would
    // raise, not corrupt.
    unsafe {
        pg_sys::SetConfigOption(name.as_ptr(), value.as_ptr(), pg_sys::GucContext::PGC_SUSET, pg_sys::GucSource::PGC_S_OVERRIDE);
    }
}

