//! Shared memory, for the statistics, the deny cache and the escrows of hot and memory limits: with `shared_preload_libraries`,
//! the postmaster sets aside each one's area at start; backends inherit them. This file
//! holds the hooks and asks each user for its area; the users call down to `area`, never up.
//! It also drops what each user keeps of a database when the database is dropped, so that a
//! new database given the same OID (`CREATE DATABASE ... OID`, or wraparound) starts empty.

use std::cell::RefCell;
use std::ffi::c_void;

use pgrx::pg_sys;

mod area;
pub mod deny_cache;
pub mod gate;
pub mod hot;
pub mod memory;
pub mod stats;

static mut PREV_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP: pg_sys::shmem_startup_hook_type = None;
static mut PREV_OBJECT_ACCESS: pg_sys::object_access_hook_type = None;

thread_local! {
    /// The databases this backend's transaction drops (DROP DATABASE runs in a transaction of
    /// its own, and may still fail after the hook: other sessions connected).
    static DROPPING: RefCell<Vec<pg_sys::Oid>> = const { RefCell::new(Vec::new()) };
}

/// From `_PG_init` when preloading.
pub fn register() {
    // SAFETY: _PG_init runs once, single-threaded, in the postmaster when preloading; the
    // previous hooks are kept and called first, as every extension does. The transaction
    // callback lives as long as the library, in every backend the postmaster starts.
    unsafe {
        PREV_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request);
        PREV_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(startup);
        PREV_OBJECT_ACCESS = pg_sys::object_access_hook;
        pg_sys::object_access_hook = Some(object_access);
        pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
    }
}

/// # Safety
/// Only as `object_access_hook`, installed by `register`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn object_access(
    access: pg_sys::ObjectAccessType::Type,
    class: pg_sys::Oid,
    object: pg_sys::Oid,
    sub: i32,
    arg: *mut c_void,
) {
    // SAFETY: the previous hook, with the arguments the server gave this one; set before
    // this hook could run and never written again.
    unsafe {
        if let Some(previous) = PREV_OBJECT_ACCESS {
            previous(access, class, object, sub, arg);
        }
    }
    if access == pg_sys::ObjectAccessType::OAT_DROP && class == pg_sys::DatabaseRelationId {
        DROPPING.with_borrow_mut(|dropping| dropping.push(object));
        // Before DROP DATABASE looks for sessions connected to it: the memory snapshot's
        // worker there is one, and ends when it sees this (within a second).
        memory::database_dropping(object, true);
    }
}

/// # Safety
/// Only as a transaction callback, registered by `register`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    match event {
        // The drop is done: its sessions are gone, and their transactions settled.
        pg_sys::XactEvent::XACT_EVENT_COMMIT => {
            for database in DROPPING.take() {
                hot::forget_database(database);
                memory::drop_database(database);
                stats::forget_database(database);
                deny_cache::forget_database(database);
            }
        }
        pg_sys::XactEvent::XACT_EVENT_ABORT => {
            for database in DROPPING.take() {
                memory::database_dropping(database, false);
            }
        }
        _ => {}
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
        gate::request();
        hot::request();
        memory::request();
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
        gate::attach();
        hot::attach();
        memory::attach();
    }
}
