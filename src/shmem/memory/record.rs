//! One entry's counts as bytes, the same for the file a clean shutdown writes (`saved`) and
//! the rows the worker writes (`snapshot`): which entry (24 bytes) and its counts (57).

use crate::bucket::escrow::Stored;
use crate::bucket::State;

use super::entry::Packed;
use super::{Entry, Identity, Table};

/// The entry's key tag and variant: what finds it in a database.
pub const NAME: usize = 24;

/// The limit's tag, the config's fingerprint, the packed state (value, instant, two counts,
/// how many of them), and its latest debit's instant.
pub const COUNTS: usize = 8 * 2 + 8 * 4 + 1 + 8;

/// An entry as saved: its name, counts, and when they equal an absent key's.
#[derive(Clone, Copy)]
pub struct Record {
    pub name: [u8; NAME],
    pub counts: [u8; COUNTS],
    pub expires: f64,
}

/// The state a record starts from: with calls in flight, the escrow's tail (they count as
/// if they will commit, credits as if they will not: `Escrow::snapshot`).
pub fn of(table: &Table, entry: &Entry) -> Record {
    let (state, at) = match entry.in_flight {
        0 => entry.at_rest(),
        n => table.in_flight(n - 1).escrow_ref().snapshot(),
    };
    let packed = Packed::store(state);
    let (value, ts, c, len) = packed.parts();
    let mut counts = Vec::with_capacity(COUNTS);
    counts.extend_from_slice(&entry.limit.to_le_bytes());
    counts.extend_from_slice(&entry.config.to_le_bytes());
    for v in [value, ts, c[0], c[1]] {
        counts.extend_from_slice(&v.to_le_bytes());
    }
    counts.push(len as u8);
    counts.extend_from_slice(&at.to_le_bytes());
    // The key's tag first, as `Rows::Key` deletes a key's rows under every config.
    let id = entry.identity();
    let mut name = [0; NAME];
    name[..16].copy_from_slice(&id.key_bytes());
    name[16..].copy_from_slice(&id.variant.to_le_bytes());
    Record { name, counts: counts.try_into().expect("COUNTS bytes"), expires: entry.expires }
}

fn word(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// What a saved entry was, if `name` and `counts` are of this format's sizes: its identity,
/// config, committed state and latest debit's instant.
pub fn parse(name: &[u8], counts: &[u8]) -> Option<(Identity, u64, State, f64)> {
    if name.len() != NAME || counts.len() != COUNTS {
        return None;
    }
    let id = Identity { key: [word(name, 0), word(name, 8)], variant: word(name, 16), limit: word(counts, 0) };
    let config = word(counts, 8);
    let number = |at: usize| f64::from_bits(word(counts, at));
    let len = usize::from(counts[48]).min(2);
    let state = Packed::from_parts(number(16), number(24), [number(32), number(40)], len).load();
    Some((id, config, state, number(49)))
}
