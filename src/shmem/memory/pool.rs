//! The escrows of keys with calls in flight, lent to their entries (`InFlight`): a share
//! of `PER_BACKEND` for each backend, which only it takes from (with no lock: a bit per
//! escrow that only the share's backend sets), and which whoever settles the last call of a
//! key gives back. A backend whose share is lent out decides its next new key's call on the
//! committed state (`Guard::list`).

use std::sync::atomic::{AtomicU64, Ordering::*};

use pgrx::pg_sys;

use super::Table;

/// Keys with calls in flight that one backend can have started at once.
pub const PER_BACKEND: usize = 32;

/// Shares of the pool: one per process that can call, the first `MaxBackends` of
/// `ProcGlobal`'s (backends, autovacuum, background workers and WAL senders; the auxiliary
/// processes and prepared transactions come after them, and a process past the shares
/// borrows nothing).
pub fn shares() -> usize {
    // SAFETY: set before shared memory is requested (PostgreSQL 15 and later compute
    // MaxBackends before the request hook runs).
    unsafe { pg_sys::MaxBackends }.max(0) as usize
}

/// This backend's place among `ProcGlobal`'s processes.
fn my_share() -> Option<usize> {
    // SAFETY: MyProc is this backend's PGPROC, an element of ProcGlobal->allProcs, both set
    // before any SQL runs (null only in processes without one).
    unsafe {
        if pg_sys::MyProc.is_null() || pg_sys::ProcGlobal.is_null() {
            return None;
        }
        let first = (*pg_sys::ProcGlobal).allProcs;
        Some(pg_sys::MyProc.offset_from(first) as usize)
    }
}

fn bits(table: &Table, share: usize) -> &AtomicU64 {
    // SAFETY: `pool_bits` holds a word per share, `share` below the count (checked by callers).
    unsafe { &*table.pool_bits.add(share) }
}

/// An escrow of this backend's share to lend, if one is free.
pub fn take(table: &Table) -> Option<u32> {
    let share = my_share().filter(|s| *s < table.header.pool_shares as usize)?;
    let word = bits(table, share);
    let taken = word.load(Acquire);
    let free = (!taken).trailing_zeros() as usize;
    if free >= PER_BACKEND {
        return None;
    }
    // Only this backend sets bits of its share, so the bit is still clear.
    word.fetch_or(1 << free, AcqRel);
    Some((share * PER_BACKEND + free) as u32)
}

/// Escrow `slot` settled: free for its share's backend again.
pub fn give_back(table: &Table, slot: u32) {
    let (share, bit) = (slot as usize / PER_BACKEND, slot as usize % PER_BACKEND);
    bits(table, share).fetch_and(!(1u64 << bit), AcqRel);
}
