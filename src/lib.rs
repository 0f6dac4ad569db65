//! rate_limiter: transactional rate limits (token bucket, fixed, sliding and rolling window)
//! inside PostgreSQL.
//! This file wires the modules, the settings and the SQL scripts together.
#![deny(unsafe_op_in_unsafe_fn)]

use pgrx::prelude::*;

mod api;
mod bucket;
mod cache;
mod call;
mod clock;
mod config;
mod error;
mod hash;
mod http;
mod limiter;
mod lists;
mod overrides;
mod worker;
mod prune_worker;
mod settings;
mod shmem;
mod snapshot_worker;
mod storage;
mod transaction;
mod unguarded;

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

::pgrx::pg_module_magic!();

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: a plain bool the postmaster sets only while loading shared_preload_libraries;
    // this process is single-threaded, so no write can race this read.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    settings::register(preloading);
    cache::register_invalidation();
    prune_worker::register();
    // The plain lists first: in_flight's settling touches shared memory, and may raise.
    transaction::register(&[
        limiter::held_shards::at_end,
        storage::held_locks::at_end,
        limiter::in_flight::at_end,
        shmem::gate::at_end,
    ]);
    if preloading {
        shmem::register();
        if shmem::memory::enabled() {
            snapshot_worker::register();
        }
    }
}

extension_sql_file!("../sql/bootstrap.sql", name = "bootstrap", bootstrap);
extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        // Shared memory (statistics, the deny cache) gets #[pg_test]s too; both workers stay
        // off: the prune worker would change state rows under a test, and the snapshot worker
        // would commit memory limits' counts that another test's prune() then counts (three
        // tests' prune() answered one row too many under Valgrind). A crash or failed
        // assertion anywhere (a worker's too, or a backend's between tests) shuts the server
        // down instead of restarting it, so that every later test fails: the harness keeps
        // the server's log to itself.
        vec!["shared_preload_libraries = 'rate_limiter'", "rate_limiter.prune_interval = 0", "rate_limiter.memory_snapshot = 0", "restart_after_crash = off"]
    }
}
