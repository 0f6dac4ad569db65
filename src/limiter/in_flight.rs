//! What this backend's open transaction holds in shared memory, settled when it ends: calls
//! of hot and memory limits in flight (their escrows' debits), escrows to drop at commit,
//! and folds of hot logs. One set of transaction callbacks serves both kinds of escrow.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::bucket::Config;
use crate::config;
use crate::error::Error;
use crate::shmem::{hot, memory};

/// A call that took tokens from an escrow, until its transaction ends.
pub enum Debit {
    Hot(hot::Ticket, u64),
    /// With the config it was admitted under: the entry keeps only its fingerprint.
    Memory(memory::Ticket, u64, Config),
}

/// Which escrows a commit drops.
pub enum Forget {
    /// A hot limit's key, a hot limit, every hot limit of the database.
    Key(String, Option<String>),
    Name(String),
    Database,
    /// A memory limit's key (`Identity`'s tag), or every key of one.
    MemoryKey(memory::Identity),
    MemoryLimit(u64),
    /// Nothing dropped: a memory limit changed, and its keys' counts are taken on under the
    /// configs they may now be decided under (this transaction's own calls are refused until
    /// the commit).
    MemoryChanged(u64, Vec<Config>),
}

#[derive(Default)]
struct Open {
    debits: Vec<(Debit, pg_sys::SubTransactionId)>,
    forget: Vec<(Forget, pg_sys::SubTransactionId)>,
    /// The hot escrows whose logs this transaction folds.
    folding: Vec<(hot::Ticket, pg_sys::SubTransactionId)>,
}

thread_local! {
    static OPEN: RefCell<Open> = RefCell::new(Open::default());
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

fn subtransaction() -> pg_sys::SubTransactionId {
    // SAFETY: reads this backend's transaction state, inside a transaction.
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}

/// Before the first thing noted: the callbacks, once per backend.
pub fn register_callbacks() {
    if !REGISTERED.get() {
        // SAFETY: both callbacks live as long as the library; registered once per backend.
        unsafe {
            pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
        }
        REGISTERED.set(true);
    }
}

/// Note a debit, to settle when its (sub)transaction ends.
pub fn note_debit(debit: Debit) {
    OPEN.with_borrow_mut(|open| open.debits.push((debit, subtransaction())));
}

/// How many debits this transaction holds: a mark to take back to.
pub fn mark() -> usize {
    OPEN.with_borrow(|open| open.debits.len())
}

/// Take back every debit noted since `mark` (`rate_limit_all`'s memory parts, when one is
/// denied), as a rolled-back savepoint around them would.
pub fn take_back_since(mark: usize) {
    let taken = OPEN.with_borrow_mut(|open| open.debits.split_off(mark));
    settle(taken, false);
}

/// Note a fold of a hot log by this transaction.
pub fn note_folding(ticket: hot::Ticket) {
    OPEN.with_borrow_mut(|open| open.folding.push((ticket, subtransaction())));
}

/// Drop these escrows when the transaction commits.
pub fn forget_at_commit(what: Forget) {
    register_callbacks();
    let at = subtransaction();
    OPEN.with_borrow_mut(|open| {
        // Asked once per (sub)transaction: a statement that changes many overrides of one memory
        // limit would otherwise walk the whole table of keys at commit once for each row.
        let again = |(w, s): &(Forget, pg_sys::SubTransactionId)| {
            *s == at && matches!((w, &what), (Forget::MemoryChanged(l, c), Forget::MemoryChanged(limit, config)) if l == limit && c == config)
        };
        if !open.forget.iter().any(again) {
            open.forget.push((what, at));
        }
    });
}

/// Whether this transaction (in a subtransaction not rolled back) asked to drop what `hit`
/// accepts.
pub fn forgotten_here(hit: impl Fn(&Forget) -> bool) -> bool {
    OPEN.with_borrow(|open| open.forget.iter().any(|(what, _)| hit(what)))
}

/// The folds of these escrows ended, done or undone.
fn end_folds(folding: Vec<(hot::Ticket, pg_sys::SubTransactionId)>, folded: bool) {
    for mut guard in folding.into_iter().filter_map(|(ticket, _)| hot::redeem(ticket)) {
        guard.entry().end_fold(folded);
    }
}

/// Settle this backend's debits: committed, or taken back. An escrow gone meanwhile was
/// dropped by this transaction's own reset or change of the limit (or a dropped database).
fn settle(debits: Vec<(Debit, pg_sys::SubTransactionId)>, committed: bool) {
    for (debit, _) in debits {
        match debit {
            Debit::Hot(ticket, seq) => {
                if let Some(mut guard) = hot::redeem(ticket) {
                    let entry = guard.entry();
                    let config = *entry.config();
                    if committed {
                        if entry.escrow().commit(&config, seq) {
                            entry.note_committed();
                        }
                    } else {
                        entry.escrow().abort(&config, seq);
                    }
                }
            }
            Debit::Memory(ticket, seq, config) => {
                if let Some(mut guard) = memory::redeem(ticket) {
                    guard.settle(seq, committed, &config);
                }
            }
        }
    }
}

fn forget(what: Forget) {
    match what {
        Forget::Key(name, key) => hot::forget(Some(&name), Some(key.as_deref())),
        Forget::Name(name) => hot::forget(Some(&name), None),
        Forget::Database => {
            hot::forget(None, None);
            // SAFETY: written only while the backend connects, before any SQL runs.
            memory::forget_database(unsafe { pg_sys::MyDatabaseId });
        }
        Forget::MemoryKey(id) => memory::forget(id.limit_tag(), Some(&id)),
        Forget::MemoryLimit(limit) => memory::forget(limit, None),
        Forget::MemoryChanged(limit, configs) => {
            let tagged: Vec<(u64, Config)> = configs.into_iter().map(|c| (memory::config_tag(&config::fingerprint(&c)), c)).collect();
            memory::retune(limit, &tagged)
        }
    }
}

/// # Safety
/// Only as a transaction callback, registered by `register_callbacks`.
#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_PREPARE => {
            // COMMIT PREPARED runs in another backend, whose callbacks know nothing of these.
            let open = OPEN.with_borrow(|o| !o.debits.is_empty() || !o.forget.is_empty() || !o.folding.is_empty());
            if open {
                Error::PreparedInFlight.raise()
            }
        }
        // After the commit is durable and visible, before the locks are released: so a
        // change that waited for calls drops escrows before the next call can load one.
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT => {
            let open = OPEN.take();
            let committed = event == XACT_EVENT_COMMIT;
            settle(open.debits, committed);
            end_folds(open.folding, committed);
            if committed {
                for (what, _) in open.forget {
                    forget(what);
                }
            }
        }
        _ => {}
    }
}

/// # Safety
/// Only as a subtransaction callback, registered by `register_callbacks`.
#[pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    ending: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    use pg_sys::SubXactEvent::*;
    // Subtransactions still open when `ending` ends are nested in it: numbered after it.
    let inside = |sub: pg_sys::SubTransactionId| sub >= ending;
    match event {
        SUBXACT_EVENT_ABORT_SUB => {
            let (aborted, unfolded) = OPEN.with_borrow_mut(|open| {
                open.forget.retain(|(_, sub)| !inside(*sub));
                let (unfolded, folding) = std::mem::take(&mut open.folding).into_iter().partition(|(_, sub)| inside(*sub));
                open.folding = folding;
                let (aborted, kept) = std::mem::take(&mut open.debits).into_iter().partition(|(_, sub)| inside(*sub));
                open.debits = kept;
                (aborted, unfolded)
            });
            settle(aborted, false);
            end_folds(unfolded, false);
        }
        SUBXACT_EVENT_COMMIT_SUB => OPEN.with_borrow_mut(|open| {
            let subs = open
                .debits
                .iter_mut()
                .map(|(_, sub)| sub)
                .chain(open.forget.iter_mut().map(|(_, sub)| sub))
                .chain(open.folding.iter_mut().map(|(_, sub)| sub));
            for sub in subs {
                if inside(*sub) {
                    *sub = parent;
                }
            }
        }),
        _ => {}
    }
}
