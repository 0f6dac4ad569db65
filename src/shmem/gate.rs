//! The gate a memory limit's call passes instead of locking `rate_limiter.state`.
//!
//! A change of a limit waits for the calls in flight and keeps new ones out until it ends
//! (`hold_calls_off`). Every other call gets that from the table's lock, which costs a
//! memory limit's call about 2,000 instructions a transaction (its entry in the lock table
//! and its release at commit, bench/instructions.md). Instead, a transaction's first memory
//! call writes the transaction's id in its backend's slot, and a change counts itself in its
//! database's word, then waits for each transaction in a slot of its database through the
//! lock every transaction holds on itself (the deadlock detector sees the wait; lock_timeout
//! and cancels end it). Each side writes, then reads the other's (sequentially consistent):
//! either the call sees the change and locks the table as before, or the change sees the call
//! and waits for it. The change locks the table only after that wait, so a transaction it
//! waits for can still lock the table for a durable call; a call that saw it meanwhile locks
//! the table at once (no change holds it yet) and is waited for there. A change's count goes
//! once its invalidations are sent (`Ending::Released`), and a call takes invalidations in
//! after it passed the gate: a call that passes it after that reads the change's config.
//! docs/memory-limits.md has the whole of it, and what moved.

use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

use pgrx::pg_sys;

use super::area;
use crate::storage;
use crate::transaction::{self, Ending, SubTransactionId};

/// Words of changes under way, databases sharing one by their OID's remainder (a change in one
/// sends the others' calls through the table's lock while it lasts, nothing more).
const WORDS: usize = 64;

struct Header {
    changes: [AtomicU32; WORDS],
}

/// A backend's slot, a cache line of its own: only it writes there.
#[repr(C, align(64))]
struct Slot {
    /// The backend's database, written before `transaction`.
    database: AtomicU32,
    /// The transaction (`storage::my_transaction`, packed) whose memory calls may be in
    /// flight; 0 for none.
    transaction: AtomicU64,
}

static AREA: AtomicPtr<Header> = AtomicPtr::new(null_mut());
const SHMEM_NAME: &std::ffi::CStr = c"rate_limiter gate";

thread_local! {
    /// This transaction's id is in its slot, since this subtransaction: its abort takes every
    /// call in flight made since back, and the transaction out of the slot.
    static ENTERED: Cell<Option<SubTransactionId>> = const { Cell::new(None) };
    /// The word this transaction counted itself in, to take it out when it ends.
    static COUNTED: Cell<Option<usize>> = const { Cell::new(None) };
    /// This transaction waited for every call in flight before it counted itself (an error
    /// in the wait, caught by a savepoint, leaves it to wait again).
    static WAITED: Cell<bool> = const { Cell::new(false) };
}

fn size() -> usize {
    area::table_size::<Header, Slot>(area::processes())
}

/// # Safety
/// Only from the shmem request hook.
pub unsafe fn request() {
    // SAFETY: the caller is the shmem request hook, where this request is accepted.
    unsafe { pg_sys::RequestAddinShmemSpace(size()) };
}

/// Create the area (at start and after a crash) or attach to it.
///
/// # Safety
/// Only from `shmem_startup_hook`, holding AddinShmemInitLock.
pub unsafe fn attach() {
    // SAFETY: this function's own contract; `request` asked for this size. A new area is all
    // zeros: no change counted, every slot empty.
    let (area, _) = unsafe { area::area(SHMEM_NAME, size()) };
    AREA.store(area.cast(), Release);
}

fn gate() -> Option<(&'static Header, &'static [Slot])> {
    // SAFETY: set by `attach` to an area of `size()` bytes that lives as long as the server,
    // cache-line aligned, a header and then a slot per process; its atomics are all its data.
    unsafe {
        let header = AREA.load(Acquire).as_ref()?;
        let first = (header as *const Header).cast::<u8>().add(area::entries_offset::<Header, Slot>()).cast::<Slot>();
        Some((header, std::slice::from_raw_parts(first, area::processes())))
    }
}

/// This backend's slot (none past the first `MaxBackends` processes).
fn my_slot(slots: &[Slot]) -> Option<&Slot> {
    area::my_process().and_then(|process| slots.get(process))
}

fn word(database: u32) -> usize {
    database as usize % WORDS
}

fn packed((process, local): (i32, u32)) -> u64 {
    // A valid local id is never 0, so neither is a packed transaction.
    (u64::from(process as u32) << 32) | u64::from(local)
}

fn unpacked(transaction: u64) -> (i32, u32) {
    ((transaction >> 32) as u32 as i32, transaction as u32)
}

/// Let a memory limit's call through without the table's lock: whether it may (this
/// transaction's id is in its slot, for any change to wait for); else, a change is under way
/// in its database, or there is no gate (the library not preloaded), and the call locks the
/// table as any other. Before the call reads its config (and takes invalidations in).
pub fn enter() -> bool {
    if ENTERED.get().is_some() {
        return true;
    }
    let Some((header, slots)) = gate() else { return false };
    let Some(slot) = my_slot(slots) else { return false };
    // First, as it may raise (its first time in a backend allocates): before anything it undoes.
    transaction::tell_when_released();
    let database = area::my_database();
    slot.database.store(database, Relaxed);
    slot.transaction.store(packed(storage::my_transaction()), SeqCst);
    if header.changes[word(database)].load(SeqCst) != 0 {
        slot.transaction.store(0, Release);
        return false;
    }
    ENTERED.set(Some(transaction::current_subtransaction()));
    true
}

/// Wait for every transaction that called a limit to end, and keep new calls out until this
/// one ends (what a change of a hot or memory limit, or a lowered concurrency limit, needs:
/// docs/hot-limits.md): first the transactions in the gate's slots of this database, then
/// those holding the table's lock (`storage::lock_out_calls`).
pub fn hold_calls_off() {
    if let Some((header, slots)) = gate().filter(|_| !WAITED.get()) {
        let database = area::my_database();
        if COUNTED.get().is_none() {
            // Noted first, once the one step that may raise is done: no error can come
            // between the count and its note.
            transaction::tell_when_released();
            COUNTED.set(Some(word(database)));
            header.changes[word(database)].fetch_add(1, SeqCst);
        }
        let mine = area::my_process();
        for (process, slot) in slots.iter().enumerate() {
            let transaction = slot.transaction.load(SeqCst);
            if transaction != 0 && Some(process) != mine && slot.database.load(Relaxed) == database {
                storage::wait_for_transaction(unpacked(transaction));
            }
        }
        WAITED.set(true);
    }
    storage::lock_out_calls();
}

/// The transaction's end (`transaction::register`): once its invalidations are sent, its
/// slot is emptied and its change uncounted. The abort of the subtransaction that entered
/// the gate empties the slot at once (its calls were taken back), as it released a lock.
pub fn at_end(ending: Ending) {
    match ending {
        Ending::Released => {
            WAITED.set(false);
            leave();
            if let (Some(word), Some((header, _))) = (COUNTED.take(), gate()) {
                header.changes[word].fetch_sub(1, SeqCst);
            }
        }
        Ending::SubtransactionAborted(ending) if ENTERED.get().is_some_and(|since| since >= ending) => leave(),
        _ => {}
    }
}

/// This transaction's id out of its slot.
fn leave() {
    if ENTERED.take().is_some() {
        if let Some(slot) = gate().and_then(|(_, slots)| my_slot(slots)) {
            slot.transaction.store(0, Release);
        }
    }
}
