//! Shared memory, for the statistics, the deny cache and the escrows of hot limits: with `shared_preload_libraries`,
//! the postmaster sets aside each one's area at start; backends inherit them. This file
//! holds the hooks and asks each user for its area; the users call down to `area`, never up.

use pgrx::pg_sys;

mod area;
pub mod deny_cache;
pub mod hot;
pub mod stats;

static mut PREV_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP: pg_sys::shmem_startup_hook_type = None;

/// From `_PG_init` when preloading.
pub fn register() {
    // SAFETY: _PG_init runs once, single-threaded, in the postmaster when preloading; the
    // previous hooks are kept and called first, as every extension does.
    unsafe {
        PREV_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request);
        PREV_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(startup);
    }
}

/// # Safety
/// Only as `shmem_request_hook`, installed by `register`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request() {
    // SAFETY: this function's contract makes it the shmem request hook, the only caller
    // stats::request and deny_cache::request allow; PREV_REQUEST was set before the hook could
    // run and is never written again.
    unsafe {
        if let Some(previous) = PREV_REQUEST {
            previous();
        }
        stats::request();
        deny_cache::request();
        hot::request();
    }
}

/// # Safety
/// Only as `shmem_startup_hook`, installed by `register`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup() {
    // SAFETY: called by the postmaster (at start and after a crash) while no backend runs;
    // AddinShmemInitLock serializes it with other extensions' startups, as they all do.
    unsafe {
        if let Some(previous) = PREV_STARTUP {
            previous();
        }
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
        let _held = area::Held::take(init_lock);
        stats::attach();
        deny_cache::attach();
        hot::attach();
    }
}
