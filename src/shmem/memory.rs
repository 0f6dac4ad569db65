//! The counts of memory limits (`durable => false`, docs/memory-limits.md) in shared memory:
//! `rate_limiter.memory_keys` entries, each the escrow of one (database, limit, key), in
//! partitions of `PARTITION` entries under an LWLock each, so that a call holds one lock
//! for a bounded scan and never waits for I/O.
//!
//! An entry is found by a 128-bit tag, SHA-256 of what names it, so that no caller can
//! bring a key that shares another key's counts. It is given to another key only when
//! nothing is listed in its escrow and its committed state equals an absent key's (it
//! `expires`): forgetting it changes no answer. When a partition has no such entry, a new
//! key is refused (53400), never admitted. One database holds at most its share of each
//! partition (`rate_limiter.memory_keys_per_database`).

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use sha2::{Digest, Sha256};

use crate::bucket::escrow::{Escrow, Stored};
use crate::bucket::{self, Config, Counts, State};
use crate::error::{Error, Result};

use super::area::{self, Held};

mod record;
mod saved;
pub mod snapshot;

/// Calls of one key in flight at once that an escrow lists before it sinks the older half
/// (docs/hot-limits.md: a rollback of a sunk call gives nothing back).
pub const RING: usize = 16;

/// Entries per partition, each partition under a lock of its own.
const PARTITION: usize = 64;

/// `rate_limiter.memory_keys`: how many (limit, key) pairs of memory limits can be counted
/// at once.
static ENTRIES: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// `rate_limiter.memory_keys_per_database`: how many of them one database may hold; -1 for
/// half of them.
static PER_DATABASE: GucSetting<i32> = GucSetting::<i32>::new(-1);

const SHMEM_NAME: &CStr = c"rate_limiter memory keys";
const TRANCHE: &CStr = c"rate_limiter memory keys";

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

impl Stored for Packed {
    fn store(state: State) -> Packed {
        let counts = state.counts.as_slice();
        assert!(counts.len() <= 2 && state.granted_at.is_none(), "a memory limit's kind keeps at most two counts");
        let mut packed = Packed { value: state.value, ts: state.ts, counts: [0.0; 2], len: counts.len() };
        packed.counts[..counts.len()].copy_from_slice(counts);
        packed
    }

    fn load(&self) -> State {
        let counts = Counts::new(&self.counts[..self.len]).expect("at most two counts");
        State { value: self.value, ts: self.ts, counts, granted_at: None }
    }
}

/// What names an entry: the tag of its (limit, key), the tag of its limit alone, and which
/// inline config of the name it counts (zeros for the named limit).
#[derive(Clone, Copy, PartialEq)]
pub struct Identity {
    tag: [u8; 16],
    limit: [u8; 16],
    variant: [u8; 16],
}

impl Identity {
    /// (limit, key) of the extension's incarnation `install` (an OID that changes when the
    /// extension is created again) in this database; `inline` an inline config's fingerprint.
    pub fn new(install: pg_sys::Oid, name: &str, key: Option<&str>, inline: Option<[u8; 16]>) -> Identity {
        let limit = Identity::limit(install, name);
        let key_part: &[u8] = key.map_or(b"", str::as_bytes);
        let tag = digest(&[b"memory key", &limit, &[u8::from(key.is_some())], key_part]);
        Identity { tag, limit, variant: inline.unwrap_or([0; 16]) }
    }

    /// The tag of limit `name`, to forget all its keys; the last one computed is kept, as a
    /// backend calls the same limit again and again.
    pub fn limit(install: pg_sys::Oid, name: &str) -> [u8; 16] {
        thread_local! {
            static LAST: std::cell::RefCell<(pg_sys::Oid, String, [u8; 16])> =
                const { std::cell::RefCell::new((pg_sys::InvalidOid, String::new(), [0; 16])) };
        }
        LAST.with_borrow_mut(|(last_install, last_name, tag)| {
            if *last_install != install || last_name != name || *last_install == pg_sys::InvalidOid {
                *tag = digest(&[b"memory limit", &u32::from(install).to_le_bytes(), name.as_bytes()]);
                (*last_install, *last_name) = (install, name.to_owned());
            }
            *tag
        })
    }

    /// The tag of (limit, key), under any config of the name.
    pub fn key_tag(&self) -> [u8; 16] {
        self.tag
    }

    pub fn limit_tag(&self) -> [u8; 16] {
        self.limit
    }

    /// The same (limit, key), under any config of the name.
    pub fn same_key(&self, other: &Identity) -> bool {
        self.tag == other.tag
    }
}

fn digest(parts: &[&[u8]]) -> [u8; 16] {
    let mut hasher = Sha256::new();
    for part in parts {
        // Each part's length first, so that no two lists of parts hash alike.
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize()[..16].try_into().expect("16 bytes")
}

/// Databases that can have loaded the snapshot table since the counts were last lost (a
/// crash or a promotion).
const DATABASES: usize = 1024;

/// Partitions at most (`memory_keys` at most 2^22, 64 to a partition), one bit each.
const PARTITION_WORDS: usize = (1 << 22) / PARTITION / 64;

#[repr(C)]
struct Header {
    entries: u64,
    /// Raised when shared memory holds less than the snapshot tables (`snapshot`): made after
    /// a crash (1), or a promotion. 0: nothing to load.
    epoch: AtomicU64,
    /// Started in recovery: its end (a promotion) raises `epoch`.
    recovering: AtomicBool,
    /// Which databases loaded their snapshot at which epoch, under the last lock of the
    /// tranche.
    loaded: [Loaded; DATABASES],
    /// A bit per partition with an entry changed since its last snapshot: the worker's
    /// round reads only those.
    changed: [AtomicU64; PARTITION_WORDS],
}

/// A database (its OID) and the epoch it loaded at; atomics so that the header is shared
/// as it is, but read and written only under the lock (see `snapshot`).
#[repr(C)]
struct Loaded {
    database: AtomicU32,
    epoch: AtomicU64,
}

/// The transaction (as `storage::my_transaction` gives it) that holds a listed debit in flight.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Holder {
    /// 0: none.
    seq: u64,
    transaction: (i32, u32),
}

/// One memory (database, limit, key) and its escrow.
#[repr(C)]
pub struct Entry {
    used: bool,
    database: pg_sys::Oid,
    id: [u8; 16],
    limit: [u8; 16],
    variant: [u8; 16],
    /// Raised whenever the entry is given to a key or dropped: tickets of before are void.
    generation: u64,
    /// The fingerprint of the config its state is in.
    config: [u8; 16],
    /// When the committed state holds what an absent key's would (`bucket::expires`).
    expires: f64,
    /// A debit committed since the entry was claimed: until then the key is as absent as a
    /// durable limit's row that was never committed.
    committed: bool,
    /// The last debit number drawn: numbers ascend along the escrow.
    last_seq: u64,
    /// Raised by every change; the snapshot table holds the entry as of `saved`.
    changes: u64,
    saved: u64,
    /// Who holds the debits in flight, so that a call finding the ring full can wait for the
    /// oldest one's transaction.
    holders: [Holder; 2 * RING],
    escrow: Escrow<RING, Packed>,
}

impl Entry {
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

    /// Nothing in flight and nothing ever committed: the key is as absent as a durable
    /// limit's row that was never committed.
    pub fn absent(&self) -> bool {
        !self.committed && self.escrow.idle()
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

    /// A debit committed, or was folded for good.
    pub fn note_committed(&mut self) {
        self.committed = true;
    }

    /// Debit `seq` ended.
    pub fn end_holder(&mut self, seq: u64) {
        for h in self.holders.iter_mut().filter(|h| h.seq == seq) {
            *h = Holder::default();
        }
    }

    /// After a change of the escrow under `config`: when the entry may be given away.
    pub fn settled(&mut self, config: &Config) {
        self.expires = bucket::expires(self.escrow.tail(), config);
    }

    fn free(&mut self) {
        self.used = false;
        self.generation += 1;
    }

    fn is(&self, database: pg_sys::Oid, id: &Identity) -> bool {
        self.used && self.database == database && self.id == id.tag && self.variant == id.variant
    }
}

/// Where a call's debit is, for the callbacks at its transaction's end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ticket {
    index: usize,
    generation: u64,
}

static AREA: AtomicPtr<Header> = AtomicPtr::new(null_mut());
static LOCKS: AtomicPtr<pg_sys::LWLockPadded> = AtomicPtr::new(null_mut());

/// Whether memory limits are on: a preloaded library with `rate_limiter.memory_keys` > 0.
pub fn enabled() -> bool {
    entry_count() > 0
}

/// The entries asked for, in whole partitions.
fn entry_count() -> usize {
    (ENTRIES.get().max(0) as usize).next_multiple_of(PARTITION)
}

/// The header, the entries, then an index of them (`Index`): what a call scans to find its
/// key's entry, or one to give it, rather than the entries themselves (1,264 bytes each).
fn size(entries: usize) -> usize {
    area::table_size::<Header, Entry>(entries) + entries * Index::BYTES_PER_ENTRY
}

/// The tag of (database, key, variant) that finds its entry: 64 bits of the key's tag other
/// than those that pick its partition, never 0 (a free entry's).
fn tag_of(database: pg_sys::Oid, id: &[u8; 16], variant: &[u8; 16]) -> u64 {
    let bits = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    (bits(&id[8..]) ^ bits(&variant[..8]) ^ u64::from(u32::from(database)).rotate_left(29)) | 1
}

/// Three arrays after the entries, an element per entry, each kept by `refresh` under the
/// entry's partition lock: its tag (`tag_of`, 0 when free), its database (0 when free), and
/// from when it may be given away (when nothing is in flight and its counts equal an absent
/// key's: -inf when free, +inf while calls are in flight). A partition's 64 of each are 8, 4 and 8 cache lines.
struct Index {
    tags: *mut u64,
    owners: *mut u32,
    free_after: *mut f64,
}

impl Index {
    const BYTES_PER_ENTRY: usize = 8 + 4 + 8;

    fn of(header: &Header, entries: *mut Entry) -> Index {
        let n = header.entries as usize;
        // SAFETY: `size` leaves BYTES_PER_ENTRY bytes per entry after the entries: n tags,
        // n owners, n instants; the tags and instants 8-byte aligned (an entry is, and n is a
        // multiple of 64, so the owners end 8-byte aligned too).
        unsafe {
            let tags = entries.add(n).cast::<u64>();
            let owners = tags.add(n).cast::<u32>();
            let free_after = owners.add(n).cast::<f64>();
            Index { tags, owners, free_after }
        }
    }
}

/// Entry `index` changed: its place in the index follows. Under its partition's lock (or, in
/// the postmaster, before anyone else uses the table).
fn refresh(index: usize) {
    if let Some((header, entries)) = table() {
        let at = Index::of(header, entries);
        // SAFETY: an index below the count, whose partition's lock the caller holds.
        unsafe {
            let entry = &*entries.add(index);
            let live = entry.used && entry.database != pg_sys::InvalidOid;
            *at.tags.add(index) = if live { tag_of(entry.database, &entry.id, &entry.variant) } else { 0 };
            *at.owners.add(index) = if entry.used { u32::from(entry.database) } else { 0 };
            *at.free_after.add(index) = match (entry.used, entry.escrow.idle()) {
                (false, _) => f64::NEG_INFINITY,
                (true, true) => entry.expires,
                (true, false) => f64::INFINITY,
            };
        }
    }
}

/// The index in the partition starting at `first` of the entry of (`database`, `id`), if any.
fn find(header: &Header, entries: *mut Entry, first: usize, database: pg_sys::Oid, id: &Identity) -> Option<usize> {
    let want = tag_of(database, &id.tag, &id.variant);
    let at = Index::of(header, entries);
    // SAFETY: the partition's index and entries, below the count, under its lock (held by the
    // caller).
    (0..PARTITION).find(|i| unsafe { *at.tags.add(first + i) == want && (*entries.add(first + i)).is(database, id) })
}

/// An entry of the partition starting at `first` to give to a new key of `database` at `now`
/// (only one of its own when it holds its share), and whether it holds its share.
fn reusable(header: &Header, entries: *mut Entry, first: usize, database: pg_sys::Oid, now: f64) -> (Option<usize>, bool) {
    let at = Index::of(header, entries);
    let database = u32::from(database);
    // SAFETY: as in `find`.
    unsafe {
        let ours = (0..PARTITION).filter(|i| *at.owners.add(first + i) == database).count();
        let own_only = ours >= share_of_partition(header.entries as usize);
        let free = |i: &usize| *at.free_after.add(first + i) <= now && (!own_only || *at.owners.add(first + i) == database);
        ((0..PARTITION).find(free), own_only)
    }
}

/// The header and entries, when the library was preloaded with entries.
fn table() -> Option<(&'static Header, *mut Entry)> {
    // SAFETY: set by `attach` to an area of `size(entries)` bytes that lives as long as the
    // server, a header and then the entries.
    unsafe {
        let header = AREA.load(Acquire).as_ref()?;
        let first = (header as *const Header as *mut u8).add(area::entries_offset::<Header, Entry>());
        (header.entries > 0).then_some((header, first.cast::<Entry>()))
    }
}

/// The lock of partition `partition`, or with the count of partitions, of `Header::loaded`.
fn partition_lock(partition: usize) -> *mut pg_sys::LWLock {
    // SAFETY: `LOCKS` holds one lock per partition and one more from the named tranche (see
    // `attach`).
    unsafe { &raw mut (*LOCKS.load(Acquire).add(partition)).lock }
}

/// From `_PG_init`: the settings, only when preloading (a postmaster setting).
pub fn register(preloading: bool) {
    if preloading {
        GucRegistry::define_int_guc(
            c"rate_limiter.memory_keys",
            c"How many (limit, key) pairs of memory limits (durable => false) can be counted at once; 0 turns memory limits off.",
            c"Each takes about 1.3 kB of shared memory; counted in whole partitions of 64.",
            &ENTRIES,
            0,
            1 << 22,
            GucContext::Postmaster,
            GucFlags::default(),
        );
        GucRegistry::define_int_guc(
            c"rate_limiter.memory_keys_per_database",
            c"How many of the rate_limiter.memory_keys entries one database may hold; -1 for half of them.",
            c"So that one database's keys cannot take every entry from the others. Applied per partition of 64.",
            &PER_DATABASE,
            -1,
            1 << 22,
            GucContext::Suset,
            GucFlags::default(),
        );
    }
}

/// The entries of one partition that one database may hold.
fn share_of_partition(entries: usize) -> usize {
    match PER_DATABASE.get() {
        -1 => PARTITION / 2,
        n => (n.max(1) as usize * PARTITION).div_ceil(entries.max(1)).clamp(1, PARTITION),
    }
}

/// The postmaster's shmem request.
///
/// # Safety
/// Only from `shmem_request_hook`.
pub unsafe fn request() {
    // SAFETY: the request hook is where both may be called.
    unsafe {
        pg_sys::RequestAddinShmemSpace(size(entry_count()));
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), (entry_count() / PARTITION).max(1) as i32 + 1);
    }
}

/// # Safety
/// Only from `shmem_startup_hook`, holding AddinShmemInitLock.
pub unsafe fn attach() {
    let entries = entry_count();
    // SAFETY: requested with this size and these locks in `request`; a fresh area is all
    // zeros, which is a valid header and entries that are not used (numbers, `false`, and
    // escrows whose rings hold debits of zeros).
    unsafe {
        let (area, found) = area::area(SHMEM_NAME, size(entries));
        let header = area.cast::<Header>();
        if !found {
            (*header).entries = entries as u64;
        }
        LOCKS.store(pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr()), Release);
        AREA.store(header, Release);
        if !found && entries > 0 {
            // Zeros say "free" in the tags and owners; in the instants it takes -inf, since a
            // clock set before 1970 reads below 0.
            let at = Index::of(&*header, table().expect("entries").1);
            for i in 0..entries {
                *at.free_after.add(i) = f64::NEG_INFINITY;
            }
        }
        if !found && !pg_sys::IsUnderPostmaster {
            // The postmaster, making shared memory at start or after a crash: what the last
            // clean shutdown counted, and the counts to write at the next one.
            if let Some((_, first)) = table() {
                match saved::load(first, entries) {
                    Some((loaded, dropped)) => {
                        if loaded + dropped > 0 {
                            pgrx::log!("rate_limiter: {loaded} memory limit keys loaded from the last shutdown, {dropped} without room");
                        }
                    }
                    // A crash, or the first start: each database loads its snapshot table
                    // before its first memory call.
                    None => (*header).epoch.store(1, Release),
                }
            }
            (*header).recovering.store(snapshot::starts_in_recovery(), Release);
            pg_sys::on_shmem_exit(Some(save_at_exit), pg_sys::Datum::from(0));
        }
    }
}

/// # Safety
/// Only as the postmaster's `on_shmem_exit` callback, registered by `attach`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn save_at_exit(code: i32, _arg: pg_sys::Datum) {
    // A crash, an error exit or an immediate shutdown: shared memory may be inconsistent,
    // and nothing is written, so that the next start has no file and every key starts full.
    if code != 0 || !saved::shut_down_cleanly() {
        return;
    }
    if let Some((header, first)) = table() {
        // SAFETY: the postmaster exits after every backend has: no one else uses the entries.
        match unsafe { saved::save(first, header.entries as usize) } {
            Ok(n) => pgrx::log!("rate_limiter: {n} memory limit keys saved for the next start"),
            Err(e) => pgrx::warning!("rate_limiter: memory limit counts not saved: {e}"),
        }
    }
}

/// Partition `partition` has an entry changed since its last snapshot.
fn note_changed(partition: usize) {
    if let Some((header, _)) = table() {
        let (word, bit) = (&header.changed[partition / 64], 1u64 << (partition % 64));
        // Read first: the word is shared by 64 partitions, and written only when it changes.
        if word.load(Relaxed) & bit == 0 {
            word.fetch_or(bit, Relaxed);
        }
    }
}

fn database() -> pg_sys::Oid {
    // SAFETY: written only while the backend connects, before any SQL runs.
    unsafe { pg_sys::MyDatabaseId }
}

/// An entry, its partition's lock held until the guard drops.
pub struct Guard {
    entry: *mut Entry,
    index: usize,
    _held: Held,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Before the lock is released (the fields drop after this).
        refresh(self.index);
    }
}

impl Guard {
    /// The entry, to change: it is written at the next snapshot.
    pub fn entry(&mut self) -> &mut Entry {
        note_changed(self.index / PARTITION);
        // SAFETY: `entry` is in the table, and its partition's lock is held while the guard lives.
        let entry = unsafe { &mut *self.entry };
        entry.changes += 1;
        entry
    }

    pub fn entry_ref(&self) -> &Entry {
        // SAFETY: as in `entry`.
        unsafe { &*self.entry }
    }

    pub fn ticket(&self) -> Ticket {
        Ticket { index: self.index, generation: self.entry_ref().generation }
    }
}

/// Partition `partition`, held, with its first entry's index.
fn hold_partition(partition: usize) -> (Held, usize) {
    // SAFETY: a partition's lock, initialized by the postmaster; a backend holds one at a time.
    (unsafe { Held::take(partition_lock(partition)) }, partition * PARTITION)
}

fn partition_of(id: &Identity, entries: usize) -> usize {
    let bits = u64::from_le_bytes(id.tag[..8].try_into().expect("8 bytes"));
    (bits % (entries / PARTITION) as u64) as usize
}

/// The escrow of `id` in this database under the config whose fingerprint is `config`, held;
/// a key not counted yet starts from `fresh`. A limit changed since the entry was written is
/// taken on with its state, as a durable limit's row is, once nothing is in flight (a change
/// waits for every call in flight). 53400 when the partition has no entry to give.
pub fn hold(id: &Identity, name: &str, config: &[u8; 16], now: f64, fresh: impl FnOnce() -> State) -> Result<Guard> {
    let (header, entries) = table().ok_or(Error::MemoryUnavailable)?;
    let count = header.entries as usize;
    let database = database();
    let (held, first) = hold_partition(partition_of(id, count));
    // SAFETY: the partition's entries, below the table's count, under its lock.
    let entry_at = |i: usize| unsafe { &mut *entries.add(first + i) };
    let index = match find(header, entries, first, database, id) {
        Some(i) => {
            let entry = entry_at(i);
            if entry.config != *config {
                if !entry.escrow.idle() {
                    return Err(Error::ConfigRace(name.to_owned()));
                }
                entry.config = *config;
                if entry.absent() {
                    // Only rolled-back calls: fresh under the new config.
                    // SAFETY: the entry's escrow, whose ring holds zeros or debits.
                    unsafe { Escrow::restart(&raw mut entry.escrow, fresh(), f64::NEG_INFINITY) };
                }
            }
            i
        }
        None => {
            let (candidate, own_only) = reusable(header, entries, first, database, now);
            let Some(i) = candidate else {
                return Err(Error::MemoryKeysFull { share: own_only.then(|| share_of_partition(count)) });
            };
            // Computed before the entry changes hands, so that an error leaves it as it was.
            let base = fresh();
            let entry = entry_at(i);
            entry.used = true;
            entry.database = database;
            entry.id = id.tag;
            entry.limit = id.limit;
            entry.variant = id.variant;
            entry.config = *config;
            entry.generation += 1;
            // SAFETY: the entry's escrow, whose ring holds zeros or debits.
            unsafe { Escrow::restart(&raw mut entry.escrow, base, f64::NEG_INFINITY) };
            entry.expires = f64::INFINITY; // set by the caller's `settled`
            entry.holders = [Holder::default(); 2 * RING];
            entry.committed = false;
            i
        }
    };
    // SAFETY: as above.
    Ok(Guard { entry: unsafe { entries.add(first + index) }, index: first + index, _held: held })
}

/// The escrow of `id` in this database, held, if it is counted.
pub fn peek(id: &Identity) -> Option<Guard> {
    let (header, entries) = table()?;
    let database = database();
    let (held, first) = hold_partition(partition_of(id, header.entries as usize));
    let index = first + find(header, entries, first, database, id)?;
    // SAFETY: an index below the count, its partition's lock held by the guard.
    Some(Guard { entry: unsafe { entries.add(index) }, index, _held: held })
}

/// Whether this database counts (limit, key) of `id` under any config of its name.
pub fn counts_key(id: &Identity) -> bool {
    let Some((header, entries)) = table() else { return false };
    let database = database();
    let (_held, first) = hold_partition(partition_of(id, header.entries as usize));
    // SAFETY: the partition's entries, under its lock.
    (first..first + PARTITION).any(|i| unsafe {
        let e = &*entries.add(i);
        e.used && e.database == database && e.id == id.tag
    })
}

/// The entry of `ticket`, held, if it is still the one the ticket was taken from.
pub fn redeem(ticket: Ticket) -> Option<Guard> {
    let (_, entries) = table()?;
    let (held, _) = hold_partition(ticket.index / PARTITION);
    // SAFETY: the ticket's index is below the table's count, its partition's lock held.
    let entry = unsafe { entries.add(ticket.index) };
    // SAFETY: as above.
    let current = unsafe { (*entry).used && (*entry).generation == ticket.generation };
    current.then(|| Guard { entry, index: ticket.index, _held: held })
}

/// Drop the entries `ours` accepts, one partition at a time. An entry with calls still in
/// flight keeps them for their tickets but answers for no database any more (`orphan`), or
/// is kept (a change that forgets waited for every call in flight, so none is left then).
fn drop_entries(ours: impl Fn(&Entry) -> bool, orphan: bool) {
    let Some((header, entries)) = table() else { return };
    for partition in 0..header.entries as usize / PARTITION {
        let (_held, first) = hold_partition(partition);
        for i in first..first + PARTITION {
            // SAFETY: below the count, its partition's lock held.
            let entry = unsafe { &mut *entries.add(i) };
            if entry.used && ours(entry) {
                if entry.escrow.idle() {
                    entry.free();
                } else if orphan {
                    entry.database = pg_sys::InvalidOid;
                }
                refresh(i);
            }
        }
    }
}

/// Forget the counts of a database (its limits truncated); it stays loaded.
pub fn forget_database(database: pg_sys::Oid) {
    drop_entries(|entry| entry.database == database, true);
}

/// Forget a dropped database: its counts, and that it loaded its snapshot, so that a new
/// database with the same OID starts empty and loads its own.
pub fn drop_database(database: pg_sys::Oid) {
    forget_database(database);
    snapshot::forget_database(database);
}

/// Limit `limit` (`Identity::limit`) of this database changed: its named keys' counts are
/// taken on under the new config (`fingerprint`, `config`), which says from when each equals
/// an absent key's; with no config to go by, none is given away until called again.
pub fn retune(limit: [u8; 16], now: Option<&([u8; 16], Config)>) {
    let Some((header, entries)) = table() else { return };
    let database = database();
    for partition in 0..header.entries as usize / PARTITION {
        let (_held, first) = hold_partition(partition);
        for i in first..first + PARTITION {
            // SAFETY: below the count, its partition's lock held.
            let entry = unsafe { &mut *entries.add(i) };
            if entry.used && entry.database == database && entry.limit == limit && entry.variant == [0; 16] {
                match now {
                    // Only rolled-back calls: as absent as a key never called.
                    _ if entry.absent() => entry.free(),
                    Some((fingerprint, config)) if entry.escrow.idle() => {
                        entry.config = *fingerprint;
                        entry.settled(config);
                        entry.changes += 1;
                        note_changed(partition);
                    }
                    _ => entry.expires = f64::INFINITY,
                }
                refresh(i);
            }
        }
    }
}

/// Forget the counts of limit `limit` (`Identity::limit`) in this database, or of one key of
/// it (`id`, under every inline config of the name).
pub fn forget(limit: [u8; 16], id: Option<&Identity>) {
    let database = database();
    let Some((header, entries)) = table() else { return };
    let Some(id) = id else {
        return drop_entries(|entry| entry.database == database && entry.limit == limit, false);
    };
    let (_held, first) = hold_partition(partition_of(id, header.entries as usize));
    for i in first..first + PARTITION {
        // SAFETY: below the count, its partition's lock held.
        let entry = unsafe { &mut *entries.add(i) };
        if entry.used && entry.database == database && entry.id == id.tag && entry.escrow.idle() {
            entry.free();
            refresh(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Entry, Index};

    /// What docs/memory-limits.md and `rate_limiter.memory_keys` say a key costs.
    #[test]
    fn a_key_takes_at_most_1_3_kb_of_shared_memory() {
        let per_key = size_of::<Entry>() + Index::BYTES_PER_ENTRY;
        assert!(per_key <= 1300, "{per_key} bytes per key");
        println!("{per_key} bytes per key");
    }
}
