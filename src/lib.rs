//! rate_limiter: transactional rate limits (token bucket, fixed, sliding and rolling window)
//! inside PostgreSQL.
//! This file wires the modules, the settings and the SQL scripts together.
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::CString;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;

mod api;
mod blocks;
mod bucket;
mod cache;
mod clock;
mod config;
mod deny_cache;
mod error;
mod hash;
mod http;
mod limiter;
mod prune_worker;
mod shape;
mod shmem;
mod stats;
mod storage;

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

::pgrx::pg_module_magic!();

/// `rate_limiter.fake_now`: a timestamptz the limiter takes as now; empty means the real clock.
pub static FAKE_NOW: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    GucRegistry::define_string_guc(
        c"rate_limiter.fake_now",
        c"Time the rate limiter takes as now (timestamptz text); empty uses the real clock.",
        c"For tests: moves the limiter's clock. Superuser only, so it cannot be used to dodge a limit.",
        &FAKE_NOW,
        GucContext::Suset,
        GucFlags::default(),
    );
    cache::register_invalidation();
    prune_worker::register();
    // SAFETY: a plain read of a postmaster-set flag.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    stats::register(preloading);
    deny_cache::register(preloading);
    if preloading {
        shmem::register();
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
        vec![]
    }
}
