//! What this backend's open transaction holds in shared memory, settled when it ends: calls
//! of hot and memory limits in flight (their escrows' debits), escrows to drop at commit,
//! and folds of hot logs. One set of transaction callbacks serves both kinds of escrow.

use pgrx::pg_sys;

use crate::bucket::Config;
use crate::config;
use crate::error::Error;
use crate::shmem::{hot, memory};
use crate::transaction::{self, Ending, List};

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

thread_local! {
    /// The calls in flight, in the order made (`mark`).
    static DEBITS: List<Debit> = List::default();
    /// The escrows to drop at commit.
    static FORGET: List<Forget> = List::default();
    /// The hot escrows whose logs this transaction folds.
    static FOLDING: List<hot::Ticket> = List::default();
    /// Memory entries kept from being given away while a statement decides (`rate_limit_all`'s
    /// memory parts): given back when it has, or when the (sub)transaction ends if an error
    /// came first.
    static PINNED: List<(memory::Identity, Config)> = List::default();
}

/// `id`'s entry, pinned under `config`, is to be given back (`unpin_all`).
pub fn note_pinned(id: memory::Identity, config: Config) {
    PINNED.with(|pinned| pinned.add((id, config)));
}

/// Every entry `note_pinned` noted may be given away again.
pub fn unpin_all() {
    unpin(PINNED.with(List::take));
}

fn unpin(pinned: Vec<(memory::Identity, Config)>) {
    for (id, config) in pinned {
        if let Some(mut guard) = memory::peek(&id) {
            guard.settled(&config);
        }
    }
}

/// Note a debit, to settle when its (sub)transaction ends.
pub fn note_debit(debit: Debit) {
    DEBITS.with(|debits| debits.add(debit));
}

/// How many debits this transaction holds: a mark to take back to.
pub fn mark() -> usize {
    DEBITS.with(List::count)
}

/// Take back every debit noted since `mark` (`rate_limit_all`'s memory parts, when one is
/// denied), as a rolled-back savepoint around them would.
pub fn take_back_since(mark: usize) {
    let taken = DEBITS.with(|debits| debits.take_after(mark));
    settle(taken, false);
}

/// Note a fold of a hot log by this transaction.
pub fn note_folding(ticket: hot::Ticket) {
    FOLDING.with(|folding| folding.add(ticket));
}

/// Drop these escrows when the transaction commits.
pub fn forget_at_commit(what: Forget) {
    let at = transaction::current_subtransaction();
    FORGET.with(|forget| {
        // Asked once per (sub)transaction (its own, or of a subtransaction of it that committed):
        // a statement that changes many overrides of one memory limit would otherwise walk the
        // whole table of keys at commit once for each row.
        let again = forget.with_items(|asked| {
            asked.iter().any(|(w, s)| {
                *s >= at && matches!((w, &what), (Forget::MemoryChanged(l, c), Forget::MemoryChanged(limit, config)) if l == limit && c == config)
            })
        });
        if !again {
            forget.add(what);
        }
    });
}

/// Whether this transaction (in a subtransaction not rolled back) asked to drop what `hit`
/// accepts.
pub fn forgotten_here(hit: impl Fn(&Forget) -> bool) -> bool {
    FORGET.with(|forget| forget.any(hit))
}

/// The folds of these escrows ended, done or undone.
fn end_folds(folding: Vec<hot::Ticket>, folded: bool) {
    for mut guard in folding.into_iter().filter_map(hot::redeem) {
        guard.entry().end_fold(folded);
    }
}

/// Settle this backend's debits: committed, or taken back. An escrow gone meanwhile was
/// dropped by this transaction's own reset or change of the limit (or a dropped database).
fn settle(debits: Vec<Debit>, committed: bool) {
    for debit in debits {
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

/// The transaction's end (`transaction::register`): its debits settled and folds ended,
/// committed or not, and at commit the escrows it asked to drop dropped.
pub fn at_end(ending: Ending) {
    match ending {
        // COMMIT PREPARED runs in another backend, which knows nothing of these.
        Ending::Preparing => {
            if !(DEBITS.with(List::is_empty) && FORGET.with(List::is_empty) && FOLDING.with(List::is_empty) && PINNED.with(List::is_empty)) {
                Error::PreparedInFlight.raise()
            }
        }
        // After the commit is durable and visible, before the locks are released: so a
        // change that waited for calls drops escrows before the next call can load one.
        Ending::Committed | Ending::Ended => {
            let committed = ending == Ending::Committed;
            unpin(PINNED.with(List::take));
            settle(DEBITS.with(List::take), committed);
            end_folds(FOLDING.with(List::take), committed);
            let forget_all = FORGET.with(List::take);
            if committed {
                for what in forget_all {
                    forget(what);
                }
            }
        }
        Ending::Released => {}
        Ending::SubtransactionAborted(ending) => {
            FORGET.with(|forget| drop(forget.take_from(ending)));
            unpin(PINNED.with(|pinned| pinned.take_from(ending)));
            let unfolded = FOLDING.with(|folding| folding.take_from(ending));
            settle(DEBITS.with(|debits| debits.take_from(ending)), false);
            end_folds(unfolded, false);
        }
    }
}
