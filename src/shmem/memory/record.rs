//! One entry's counts as bytes, the same for the file a clean shutdown writes (`saved`) and
//! the rows the worker writes (`snapshot`): which entry (32 bytes) and its counts (73).

use pgrx::pg_sys;

use crate::bucket::escrow::{Escrow, Stored};

use super::{Entry, Holder, Identity, Packed, RING};

/// The entry's tag and variant: what finds it in a database.
pub type Name = [u8; 32];

/// The limit's tag, the config's fingerprint, the packed state (value, instant, two counts,
/// how many of them), and its latest debit's instant.
pub const COUNTS: usize = 16 * 2 + 8 * 4 + 1 + 8;

/// An entry as saved: its name, counts, and when they equal an absent key's.
pub struct Record {
    pub name: Name,
    pub counts: [u8; COUNTS],
    pub expires: f64,
}

/// The entry's counts, calls in flight included (`Escrow::snapshot`).
pub fn of(entry: &Entry) -> Record {
    let (state, at) = entry.escrow.snapshot();
    let state = Packed::store(state);
    let mut counts = Vec::with_capacity(COUNTS);
    counts.extend_from_slice(&entry.limit);
    counts.extend_from_slice(&entry.config);
    for v in [state.value, state.ts, state.counts[0], state.counts[1]] {
        counts.extend_from_slice(&v.to_le_bytes());
    }
    counts.push(state.len as u8);
    counts.extend_from_slice(&at.to_le_bytes());
    let mut name = [0; 32];
    name[..16].copy_from_slice(&entry.id);
    name[16..].copy_from_slice(&entry.variant);
    Record { name, counts: counts.try_into().expect("COUNTS bytes"), expires: entry.expires }
}

/// The identity a saved entry had, if `name` and `counts` are of the right size.
pub fn identity(name: &[u8], counts: &[u8]) -> Option<Identity> {
    if name.len() != 32 || counts.len() != COUNTS {
        return None;
    }
    let tag = |bytes: &[u8]| -> [u8; 16] { bytes.try_into().expect("16 bytes") };
    Some(Identity { tag: tag(&name[..16]), variant: tag(&name[16..]), limit: tag(&counts[..16]) })
}

/// Make `entry` the saved (database, `id`) with `counts`, committed, nothing in flight.
pub fn install(entry: &mut Entry, database: pg_sys::Oid, id: &Identity, counts: &[u8], expires: f64) {
    let mut at = 16;
    let mut take = |n: usize| {
        at += n;
        &counts[at - n..at]
    };
    let config: [u8; 16] = take(16).try_into().expect("16 bytes");
    let mut number = || f64::from_le_bytes(take(8).try_into().expect("8 bytes"));
    let (value, ts, c0, c1) = (number(), number(), number(), number());
    let len = usize::from(take(1)[0]).min(2);
    let base_at = f64::from_le_bytes(take(8).try_into().expect("8 bytes"));
    entry.used = true;
    entry.database = database;
    entry.id = id.tag;
    entry.limit = id.limit;
    entry.variant = id.variant;
    entry.config = config;
    entry.generation += 1;
    entry.expires = expires;
    entry.committed = true;
    entry.holders = [Holder::default(); 2 * RING];
    let base = Packed { value, ts, counts: [c0, c1], len };
    // SAFETY: the entry's escrow, whose ring holds zeros or debits.
    unsafe { Escrow::restart(&raw mut entry.escrow, base.load(), base_at) };
}
