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

/// Where the counts keep the limit's tag, the config's, the packed state's value, instant,
/// two counts and their length, and the latest debit's instant.
pub const LIMIT: usize = 0;
pub const CONFIG: usize = 8;
pub const VALUE: usize = 16;
pub const TS: usize = 24;
pub const COUNT: [usize; 2] = [32, 40];
pub const LEN: usize = 48;
pub const AT: usize = 49;

/// A name: the key's tag first, as `Rows::Key` forgets a key under every config, then the
/// variant.
pub fn name(key: [u8; 16], variant: u64) -> [u8; NAME] {
    let mut name = [0; NAME];
    name[..16].copy_from_slice(&key);
    name[16..].copy_from_slice(&variant.to_le_bytes());
    name
}

/// Counts: the limit's and config's tags, the four numbers (value, instant, two counts),
/// how many counts, and the latest debit's instant.
pub fn counts(limit: u64, config: u64, numbers: [f64; 4], len: usize, at: f64) -> [u8; COUNTS] {
    let mut counts = [0; COUNTS];
    counts[LIMIT..CONFIG].copy_from_slice(&limit.to_le_bytes());
    counts[CONFIG..VALUE].copy_from_slice(&config.to_le_bytes());
    for (i, v) in numbers.iter().enumerate() {
        counts[VALUE + 8 * i..VALUE + 8 * (i + 1)].copy_from_slice(&v.to_bits().to_le_bytes());
    }
    counts[LEN] = len as u8;
    counts[AT..].copy_from_slice(&at.to_bits().to_le_bytes());
    counts
}

pub fn word(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

pub fn number(bytes: &[u8], at: usize) -> f64 {
    f64::from_bits(word(bytes, at))
}

/// An entry as saved: its name, counts, and when they equal an absent key's.
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
    let (value, ts, c, len) = Packed::store(&state).parts();
    let id = entry.identity();
    Record {
        name: name(id.key_bytes(), id.variant),
        counts: counts(entry.limit, entry.config, [value, ts, c[0], c[1]], len, at),
        expires: entry.expires,
    }
}

/// What a saved entry was, if `name` and `counts` are of this format's sizes: its identity,
/// config, committed state and latest debit's instant.
pub fn parse(name: &[u8], counts: &[u8]) -> Option<(Identity, u64, State, f64)> {
    if name.len() != NAME || counts.len() != COUNTS {
        return None;
    }
    let id = Identity { key: [word(name, 0), word(name, 8)], variant: word(name, 16), limit: word(counts, LIMIT) };
    let number = |at: usize| number(counts, at);
    let len = usize::from(counts[LEN]).min(2);
    let state = Packed::from_parts(number(VALUE), number(TS), COUNT.map(number), len).load();
    Some((id, word(counts, CONFIG), state, number(AT)))
}
