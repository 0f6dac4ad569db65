//! The shards of durable limits whose rows this transaction holds locked (written or locked
//! by its calls), by limit and key: a call queues for a shard's row only above every shard
//! of that key it holds (`rows::waitable`), and the shards held by the transaction's earlier
//! calls count, or two transactions that each took from a key could each wait, in their next
//! call, for the shard the other holds (40P01). Forgotten when the transaction ends, and what
//! a subtransaction took when it aborts, which gives those locks back.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;

use pgrx::pg_sys;

use crate::call::{Fingerprint, Request};

/// (name, key, inline config): whose rows, as a `Slot` names them.
type Whose = (String, Option<String>, Option<Fingerprint>);

thread_local! {
    /// Each (name, key, config)'s held shards, with the subtransaction that took each: found
    /// by the key, not searched, however many keys the transaction calls.
    static HELD: RefCell<HashMap<Whose, Vec<(i32, pg_sys::SubTransactionId)>>> = RefCell::new(HashMap::new());
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

fn whose(req: &Request<'_>) -> Whose {
    (req.name.to_owned(), req.key.map(str::to_owned), req.inline)
}

/// The shards of `req`'s (name, key, config) this transaction holds.
pub fn of(req: &Request<'_>) -> Vec<i32> {
    HELD.with_borrow(|held| held.get(&whose(req)).map_or_else(Vec::new, |shards| shards.iter().map(|(s, _)| *s).collect()))
}

/// `shard` of `req`'s rows, of a limit of `shards` shards, is held, until the transaction (or
/// the current subtransaction, if it aborts) ends. Only a sharded limit's shards are noted: a
/// call of a limit of one shard takes shard 0 whatever it holds.
pub fn note(req: &Request<'_>, shard: i32, shards: u32) {
    if shards == 1 {
        return;
    }
    if !REGISTERED.get() {
        // SAFETY: callbacks that live as long as the library, registered once per backend.
        unsafe {
            pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
        }
        REGISTERED.set(true);
    }
    // SAFETY: inside a transaction, as every call is.
    let sub = unsafe { pg_sys::GetCurrentSubTransactionId() };
    HELD.with_borrow_mut(|held| {
        let shards = held.entry(whose(req)).or_default();
        if !shards.iter().any(|(s, _)| *s == shard) {
            shards.push((shard, sub));
        }
    });
}

/// # Safety
/// Only as a transaction callback, registered by `note`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    if matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_PARALLEL_ABORT) {
        HELD.with_borrow_mut(HashMap::clear);
    }
}

/// # Safety
/// Only as a subtransaction callback, registered by `note`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    ending: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    // What `ending` and the subtransactions nested in it (numbered after it) took.
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        HELD.with_borrow_mut(|held| {
            held.retain(|_, shards| {
                shards.retain(|(_, sub)| *sub < ending);
                !shards.is_empty()
            })
        });
    }
}
