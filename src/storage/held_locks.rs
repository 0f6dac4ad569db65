//! How many entries of the server's shared lock table this transaction holds for the
//! extension, by kind: each is a slot of the table every database shares, sized for about
//! `max_locks_per_transaction` per connection, so each kind is bounded per transaction by a
//! setting (a call past it is refused, 53400) and no caller can fill it for the cluster.

use std::cell::RefCell;
use std::ffi::c_void;

use pgrx::pg_sys;

/// What a held lock is for.
#[derive(Clone, Copy)]
pub enum HeldLock {
    /// A concurrency limit's slot (`slots.rs`).
    Slot = 0,
    /// A memory limit's key looked for outside shared memory, counted in its row
    /// (`lock_memory_key`).
    MemoryKey = 1,
}

thread_local! {
    /// The locks this transaction holds, by the subtransaction that took them. Ids rise with
    /// time and nesting: a subtransaction's abort releases the locks of every entry from its
    /// id on.
    static HELD: RefCell<Vec<(pg_sys::SubTransactionId, [u32; 2])>> = const { RefCell::new(Vec::new()) };
}

/// How many locks of `what` this transaction holds.
pub fn held(what: HeldLock) -> u32 {
    HELD.with(|h| h.borrow().iter().map(|(_, n)| n[what as usize]).sum())
}

/// `n` more locks of `what` held by this transaction, until it (or the current
/// subtransaction, if that aborts) ends. Counted by the caller once it keeps them, so a lock
/// taken twice counts twice: an overcount, never an undercount.
pub fn count_held(what: HeldLock, n: u32) {
    // SAFETY: inside a transaction, as every call is.
    let sub = unsafe { pg_sys::GetCurrentSubTransactionId() };
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if let Some((_, held)) = h.last_mut().filter(|(s, _)| *s == sub) {
            held[what as usize] += n;
        } else {
            let mut held = [0; 2];
            held[what as usize] = n;
            h.push((sub, held));
        }
    });
}

/// One lock of `what` that `count_held` counted in this subtransaction let go early.
pub fn count_released(what: HeldLock) {
    HELD.with(|h| {
        if let Some((_, held)) = h.borrow_mut().iter_mut().rev().find(|(_, n)| n[what as usize] > 0) {
            held[what as usize] -= 1;
        }
    });
}

/// From `_PG_init`: forget the counts when the transaction ends, and a subtransaction's part
/// when it aborts.
pub fn register() {
    // SAFETY: callbacks that live as long as the library, registered once per process.
    unsafe {
        pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
    }
}

/// # Safety
/// Only as a transaction callback, registered by `register`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    if matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_PARALLEL_ABORT) {
        HELD.with(|h| h.borrow_mut().clear());
    }
}

/// # Safety
/// Only as a subtransaction callback, registered by `register`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    ending: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    use pg_sys::SubXactEvent::*;
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        match event {
            SUBXACT_EVENT_ABORT_SUB => h.retain(|(s, _)| *s < ending),
            SUBXACT_EVENT_COMMIT_SUB => h.iter_mut().filter(|(s, _)| *s >= ending).for_each(|(s, _)| *s = parent),
            _ => {}
        }
    });
}
