//! How many entries of the server's shared lock table this transaction holds for the
//! extension, by kind: each is a slot of the table every database shares, sized for about
//! `max_locks_per_transaction` per connection, so each kind is bounded per transaction by a
//! setting (a call past it is refused, 53400) and no caller can fill it for the cluster.

use crate::transaction::{Ending, Held};

/// What a held lock is for.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeldLock {
    /// A concurrency limit's slot (`slots.rs`).
    Slot,
    /// A memory limit's key looked for outside shared memory, counted in its row
    /// (`lock_memory_key`).
    MemoryKey,
}

thread_local! {
    /// How many locks of each kind the transaction took, as counted, by subtransaction.
    static HELD: Held<HeldLock, u32> = Held::default();
}

/// How many locks of `what` this transaction holds.
pub fn held(what: HeldLock) -> u32 {
    HELD.with(|h| h.with_items(&what, |counts| counts.iter().map(|(n, _)| n).sum()))
}

/// `n` more locks of `what` held by this transaction, until it (or the current
/// subtransaction, if that aborts) ends. Counted by the caller once it keeps them, so a lock
/// taken twice counts twice: an overcount, never an undercount.
pub fn count_held(what: HeldLock, n: u32) {
    HELD.with(|h| h.add(what, n));
}

/// One lock of `what` that `count_held` counted let go early.
pub fn count_released(what: HeldLock) {
    HELD.with(|h| {
        h.with_items(&what, |counts| {
            if let Some((n, _)) = counts.iter_mut().rev().find(|(n, _)| *n > 0) {
                *n -= 1;
            }
        })
    });
}

/// The transaction's end (`transaction::register`): its locks are released.
pub fn at_end(ending: Ending) {
    HELD.with(|h| h.forget(ending));
}
