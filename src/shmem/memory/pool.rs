//! The escrows of keys with calls in flight, lent to their entries (`InFlight`): a share
//! of `PER_BACKEND` for each backend, which only it takes from (with no lock: a bit per
//! escrow that only the share's backend sets), and which whoever settles the last call of a
//! key gives back. A backend whose share is lent out decides its next new key's call on the
//! committed state (`Guard::list`).

use std::sync::atomic::{AtomicU64, Ordering::*};

use super::Table;
use crate::shmem::area;

/// Keys with calls in flight that one backend can have started at once.
pub const PER_BACKEND: usize = 32;

/// Shares of the pool: one per process that can call (`area::processes`).
pub fn shares() -> usize {
    area::processes()
}

fn bits(table: &Table, share: usize) -> &AtomicU64 {
    // SAFETY: `pool_bits` holds a word per share, `share` below the count (checked by callers).
    unsafe { &*table.pool_bits.add(share) }
}

/// An escrow of this backend's share to lend, if one is free.
pub fn take(table: &Table) -> Option<u32> {
    let share = area::my_process().filter(|s| *s < table.header.pool_shares as usize)?;
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
