//! What a memory limit keeps per key, and per key with calls in flight: an `Entry` is one
//! key at rest (its committed state, about 100 bytes), and an `InFlight` (the escrow of
//! calls in flight, about 1.1 kB) is lent to it from a pool while any of its calls is in
//! flight, and given back when the last one settles (docs/memory-limits.md).

use crate::bucket::escrow::{Escrow, Stored};
use crate::bucket::{Counts, State};

use super::identity::Identity;

/// Calls of one key in flight at once that an escrow lists before it sinks the older half
/// (docs/hot-limits.md: a rollback of a sunk call gives nothing back).
pub const RING: usize = 16;

/// A state as a memory limit's kinds need it: the value, the instant and up to two counts
/// (a sliding window's); no `granted_at` (a memory limit has no `min_gap`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Packed {
    value: f64,
    ts: f64,
    counts: [f64; 2],
    len: usize,
}

impl Packed {
    pub(super) fn parts(&self) -> (f64, f64, [f64; 2], usize) {
        (self.value, self.ts, self.counts, self.len)
    }

    pub(super) fn from_parts(value: f64, ts: f64, counts: [f64; 2], len: usize) -> Packed {
        Packed { value, ts, counts, len }
    }
}

impl Stored for Packed {
    fn store(state: &State) -> Packed {
        let counts = state.counts.as_slice();
        assert!(counts.len() <= 2 && state.granted_at.is_none(), "a memory limit's kind keeps at most two counts");
        let mut packed = Packed { value: state.value, ts: state.ts, counts: [0.0; 2], len: counts.len() };
        packed.counts[..counts.len()].copy_from_slice(counts);
        packed
    }

    fn load(&self) -> State {
        let counts = Counts::new(&self.counts[..self.len.min(2)]).expect("at most two counts");
        State { value: self.value, ts: self.ts, counts, granted_at: None }
    }
}

const USED: u8 = 1;
/// Counted under an inline config, which `config` names.
const INLINE: u8 = 2;
/// A debit committed since the entry was claimed: until then the key is as absent as a
/// durable limit's row that was never committed.
const COMMITTED: u8 = 4;

/// One memory (database, limit, key) at rest.
#[repr(C)]
pub struct Entry {
    pub(super) key: [u64; 2],
    pub(super) limit: u64,
    /// The fingerprint of the config its state is in (an inline config's also names it).
    pub(super) config: u64,
    pub(super) database: u32,
    /// Raised whenever the entry is given to a key or dropped: tickets of before are void.
    pub(super) generation: u32,
    /// The committed state (while calls are in flight, the escrow's base is).
    state: Packed4,
    /// The latest instant of a debit in the state.
    base_at: f64,
    /// When the state (the escrow's tail while calls are in flight) equals an absent key's.
    pub(super) expires: f64,
    /// Raised by every change; the snapshot table holds the entry as of `saved`.
    pub(super) changes: u32,
    pub(super) saved: u32,
    /// 1 + the `InFlight` lent to it, 0 when nothing is in flight.
    pub(super) in_flight: u32,
    flags: u8,
}

/// `Packed` without its padding: the counts' number goes with the flags.
#[derive(Clone, Copy)]
#[repr(C)]
struct Packed4 {
    value: f64,
    ts: f64,
    counts: [f64; 2],
}

impl Entry {
    pub(super) fn used(&self) -> bool {
        self.flags & USED != 0
    }

    pub(super) fn inline(&self) -> bool {
        self.flags & INLINE != 0
    }

    /// The entry of `id` in `database`.
    pub(super) fn is(&self, database: u32, id: &Identity) -> bool {
        self.same_key(database, id) && self.inline() == (id.variant != 0) && (id.variant == 0 || self.config == id.variant)
    }

    /// An entry of (limit, key) of `id` in `database`, under any config of its name.
    pub(super) fn same_key(&self, database: u32, id: &Identity) -> bool {
        self.used() && self.database == database && self.key == id.key
    }

    /// What names the entry.
    pub(super) fn identity(&self) -> Identity {
        Identity { key: self.key, limit: self.limit, variant: if self.inline() { self.config } else { 0 } }
    }

    /// The committed state at rest and the instant of its latest debit.
    pub fn at_rest(&self) -> (State, f64) {
        let s = self.state;
        let packed = Packed { value: s.value, ts: s.ts, counts: s.counts, len: usize::from(self.flags >> 4) };
        (packed.load(), self.base_at)
    }

    pub(super) fn set_at_rest(&mut self, state: State, base_at: f64) {
        let p = Packed::store(&state);
        self.state = Packed4 { value: p.value, ts: p.ts, counts: p.counts };
        self.flags = (self.flags & 0x0f) | ((p.len as u8) << 4);
        self.base_at = base_at;
    }

    /// Given to `id` of `database` under config `config`, starting from `fresh`.
    pub(super) fn claim(&mut self, database: u32, id: &Identity, config: u64, fresh: State) {
        self.key = id.key;
        self.limit = id.limit;
        self.config = config;
        self.database = database;
        self.generation = self.generation.wrapping_add(1);
        self.flags = USED | if id.variant != 0 { INLINE } else { 0 };
        self.set_at_rest(fresh, f64::NEG_INFINITY);
        self.expires = f64::INFINITY; // set by the caller's `settled`
        self.in_flight = 0;
    }

    /// Made the saved `id` of `database`, committed, nothing in flight.
    pub(super) fn install(&mut self, database: u32, id: &Identity, config: u64, state: State, base_at: f64, expires: f64) {
        self.claim(database, id, config, state);
        self.base_at = base_at;
        self.expires = expires;
        self.flags |= COMMITTED;
    }

    pub(super) fn free(&mut self) {
        self.flags = 0;
        self.database = 0;
        self.generation = self.generation.wrapping_add(1);
    }

    pub fn committed(&self) -> bool {
        self.flags & COMMITTED != 0
    }

    pub(super) fn note_committed(&mut self) {
        self.flags |= COMMITTED;
    }

    /// Nothing in flight and nothing ever committed: the key is as absent as a durable
    /// limit's row that was never committed.
    pub fn absent(&self) -> bool {
        !self.committed() && self.in_flight == 0
    }
}

/// The transaction (as `storage::my_transaction` gives it) that holds a listed debit in flight.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Holder {
    /// 0: none.
    seq: u64,
    transaction: (i32, u32),
}

/// The escrow of one key's calls in flight, lent to its entry from the pool.
#[repr(C)]
pub struct InFlight {
    /// The last debit number drawn: numbers ascend along the escrow.
    last_seq: u64,
    /// Who holds the debits in flight, so that a call finding the ring full can wait for the
    /// oldest one's transaction.
    holders: [Holder; 2 * RING],
    escrow: Escrow<RING, Packed>,
}

impl InFlight {
    /// Lent to an entry whose committed state is `base`, its latest debit at `base_at`.
    pub(super) fn start(&mut self, base: State, base_at: f64) {
        self.last_seq = 0;
        self.holders = [Holder::default(); 2 * RING];
        // SAFETY: the escrow's ring holds zeros (a fresh area) or debits it listed before.
        unsafe { Escrow::restart(&raw mut self.escrow, base, base_at) };
    }

    pub fn escrow(&mut self) -> &mut Escrow<RING, Packed> {
        &mut self.escrow
    }

    pub fn escrow_ref(&self) -> &Escrow<RING, Packed> {
        &self.escrow
    }

    /// The next debit number.
    pub fn draw_seq(&mut self) -> u64 {
        self.last_seq += 1;
        self.last_seq
    }

    /// Debit `seq` is held by `transaction` until it ends.
    pub fn note_holder(&mut self, seq: u64, transaction: (i32, u32)) {
        if let Some(free) = self.holders.iter_mut().find(|h| h.seq == 0) {
            *free = Holder { seq, transaction };
        }
    }

    /// The transaction that holds debit `seq`, when known.
    pub fn holder_of(&self, seq: u64) -> Option<(i32, u32)> {
        self.holders.iter().find(|h| h.seq == seq).map(|h| h.transaction)
    }

    /// Forget the holders of debits no longer listed in flight (folded when the ring was
    /// full; a settled debit's holder is forgotten when it settles): the room is for those
    /// that are.
    pub fn forget_holders_of_settled(&mut self) {
        let listed: Vec<u64> = self.escrow.in_flight().collect();
        for h in self.holders.iter_mut().filter(|h| h.seq != 0 && !listed.contains(&h.seq)) {
            *h = Holder::default();
        }
    }

    /// Debit `seq` ended.
    pub(super) fn end_holder(&mut self, seq: u64) {
        for h in self.holders.iter_mut().filter(|h| h.seq == seq) {
            *h = Holder::default();
        }
    }

    /// The committed state and its latest debit's instant, once nothing is in flight.
    pub(super) fn settled_base(&self) -> Option<(State, f64)> {
        self.escrow.idle().then(|| self.escrow.snapshot())
    }
}
