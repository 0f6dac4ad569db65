//! The counts of memory limits (`durable => false`, docs/memory-limits.md) in shared memory:
//! `rate_limiter.memory_keys` entries of about 100 bytes, each one (database, limit, key) at
//! rest, in partitions of `PARTITION` entries under an LWLock each, so that a call holds one
//! lock (two to give a key an entry) for a bounded scan and never waits for I/O. A key with
//! calls in flight borrows an escrow from a pool sized by connections (`pool`), given back
//! when they settle.
//!
//! A key may live in either of two partitions that a keyed hash picks (`identity`): a new
//! key goes to the emptier one, so that the table fills evenly, and no caller can choose
//! keys that crowd another's. An entry is given to another key only when nothing is in
//! flight in it and its committed state equals an absent key's (it `expires`): forgetting
//! it changes no answer. One database holds at most its share of the whole table
//! (`shares`). A key that finds no room is not counted here: the caller counts it
//! elsewhere (`limiter::memory`), never admits it for want of room.

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering::*};

use pgrx::pg_sys;

use crate::bucket::escrow::{Admitted, Escrow, Planned};
use crate::bucket::{self, Config, State};
use crate::error::{Error, Result};
use crate::settings;

use super::area::{self, Held};

mod entry;
mod packed;
mod identity;
mod pool;
mod record;
mod saved;
mod shares;
pub mod snapshot;

pub use entry::{Entry, InFlight, RING};
pub use identity::{config_tag, Identity};
pub use shares::Rows;

/// Entries per partition, each partition under a lock of its own.
const PARTITION: usize = 64;

/// Inline configs of one (limit, key) counted here at once: more are counted elsewhere, so
/// that a caller's variants cannot crowd out the named limit's count of the key.
const INLINE_VARIANTS: usize = 4;


const SHMEM_NAME: &CStr = c"rate_limiter memory keys";
const TRANCHE: &CStr = c"rate_limiter memory keys";

/// Databases that can hold entries, or have loaded the snapshot table since the counts
/// were last lost (a crash or a promotion).
const DATABASES: usize = 1024;

#[repr(C)]
struct Header {
    entries: u64,
    /// Backends with a share of the pool of escrows in flight (`pool`).
    pool_shares: u64,
    /// The cluster's secret (`identity`), read by the postmaster at start.
    secret: [u64; 2],
    /// The tranche of the partitions' locks.
    tranche: i32,
    /// Raised when shared memory holds less than the snapshot tables (`snapshot`): made after
    /// a crash (1), or a promotion. 0: nothing to load.
    epoch: AtomicU64,
    /// Started in recovery: its end (a promotion) raises `epoch`.
    recovering: AtomicBool,
    /// Which databases loaded their snapshot at which epoch, under the named tranche's lock.
    loaded: [snapshot::Loaded; DATABASES],
    /// How many entries each database holds, under the same lock when a database is added.
    shares: [shares::Share; DATABASES],
}

/// A partition's lock and its index, an element per entry (a tag, and from when the entry may
/// be given away), which a call scans rather than the entries: side by side, so that a call
/// touches these lines and its entry's alone, two pages of shared memory where the locks, the
/// tags and the instants in arrays apart made four (each a TLB miss, in a table too large
/// for the TLB to map).
#[repr(C, align(64))]
struct Partition {
    lock: pg_sys::LWLock,
    tags: [u32; PARTITION],
    free_after: [f64; PARTITION],
}

/// Where each part of the area starts, in bytes, after the header: a bit per partition
/// with an entry changed since its last snapshot (the worker's round reads only those); the
/// partitions' locks and index; the entries; the pool's bits and its escrows.
struct Layout {
    changed: usize,
    partitions: usize,
    entries: usize,
    pool_bits: usize,
    pool: usize,
    size: usize,
}

impl Layout {
    fn of(entries: usize, pool_shares: usize) -> Layout {
        let after = |at: usize, align: usize| at.next_multiple_of(align);
        let changed = after(size_of::<Header>(), 64);
        let partitions = after(changed + (entries / PARTITION).div_ceil(64) * 8, 64);
        let entries_at = after(partitions + entries / PARTITION * size_of::<Partition>(), 64);
        let pool_bits = after(entries_at + entries * size_of::<Entry>(), 64);
        let pool = after(pool_bits + pool_shares * 8, 64);
        let size = pool + pool_shares * pool::PER_BACKEND * size_of::<InFlight>();
        Layout { changed, partitions, entries: entries_at, pool_bits, pool, size }
    }
}

/// Shared memory a key costs at rest: its entry, and its part of a partition's lock and index.
#[cfg(test)]
const BYTES_PER_KEY: usize = size_of::<Entry>() + size_of::<Partition>() / PARTITION;

/// The area, as pointers into it.
struct Table {
    header: &'static Header,
    changed: *const AtomicU64,
    partitions: *mut Partition,
    entries: *mut Entry,
    pool_bits: *const AtomicU64,
    pool: *mut InFlight,
}

impl Table {
    fn count(&self) -> usize {
        self.header.entries as usize
    }

    fn partitions(&self) -> usize {
        self.count() / PARTITION
    }

    /// Entry `i`. The caller holds its partition's lock for as long as it uses it.
    #[allow(clippy::mut_from_ref)]
    fn entry(&self, i: usize) -> &mut Entry {
        debug_assert!(i < self.count());
        // SAFETY: below the count; the caller holds the partition's lock, so no other
        // process touches the entry meanwhile.
        unsafe { &mut *self.entries.add(i) }
    }

    /// The index's tags of partition `partition`.
    fn tags_of(&self, partition: usize) -> &[u32] {
        // SAFETY: below the count of partitions; read under its lock (see `entry`).
        unsafe { &(*self.partitions.add(partition)).tags }
    }

    /// The entries of partition `partition` that answer for a key of a database (a tag in the
    /// index): a scan of every key reads these alone, and leaves the pages of entries never
    /// used untouched. Read under its lock; the tags are copied, so the caller may change the
    /// entries it is given.
    fn live(&self, partition: usize) -> impl Iterator<Item = usize> {
        debug_assert!(partition < self.partitions());
        // SAFETY: below the count of partitions; read under its lock (see `entry`).
        let tags = unsafe { (*self.partitions.add(partition)).tags };
        (0..PARTITION).filter(move |i| tags[*i] != 0).map(move |i| partition * PARTITION + i)
    }

    /// From when each entry of partition `partition` may be given away.
    fn free_after_of(&self, partition: usize) -> &[f64] {
        // SAFETY: as in `tags_of`.
        unsafe { &(*self.partitions.add(partition)).free_after }
    }

    /// The lock of partition `partition`.
    fn lock(&self, partition: usize) -> *mut pg_sys::LWLock {
        debug_assert!(partition < self.partitions());
        // SAFETY: below the count of partitions, whose locks `attach` initialized.
        unsafe { &raw mut (*self.partitions.add(partition)).lock }
    }

    /// Partitions `which`, held in ascending order (so that two holders never wait for each
    /// other), each once.
    fn hold_partitions(&self, which: [usize; 2]) -> [Option<Held>; 2] {
        let (low, high) = (which[0].min(which[1]), which[0].max(which[1]));
        // SAFETY: partitions' locks, taken in ascending order; a backend holds at most these
        // two at a time.
        unsafe { [Some(Held::take(self.lock(low))), (high != low).then(|| Held::take(self.lock(high)))] }
    }

    /// Entry `i` changed: its place in the index follows. Under its partition's lock.
    fn refresh(&self, i: usize) {
        let entry = self.entry(i);
        let live = entry.used() && entry.database != 0;
        let tag = if live { entry.identity().index_tag() } else { 0 };
        let free_after = match (entry.used(), entry.in_flight) {
            (false, _) => f64::NEG_INFINITY,
            (true, 0) => entry.expires,
            (true, _) => f64::INFINITY,
        };
        // SAFETY: entry i's partition, below the count; written under its lock, held.
        unsafe {
            let partition = self.partitions.add(i / PARTITION);
            (*partition).tags[i % PARTITION] = tag;
            (*partition).free_after[i % PARTITION] = free_after;
        }
    }

    /// Entry `i`, to change: it is written at the next snapshot. Under its partition's lock.
    #[allow(clippy::mut_from_ref)]
    fn entry_to_change(&self, i: usize) -> &mut Entry {
        self.note_changed(i / PARTITION);
        let entry = self.entry(i);
        entry.changes = entry.changes.wrapping_add(1);
        entry
    }

    /// Partition `partition` has an entry changed since its last snapshot.
    fn note_changed(&self, partition: usize) {
        // SAFETY: `changed` holds a bit per partition.
        let word = unsafe { &*self.changed.add(partition / 64) };
        let bit = 1u64 << (partition % 64);
        // Read first: the word is shared by 64 partitions, and written only when it changes.
        if word.load(Relaxed) & bit == 0 {
            word.fetch_or(bit, Relaxed);
        }
    }

    /// Lent escrow `slot`.
    #[allow(clippy::mut_from_ref)]
    fn in_flight(&self, slot: u32) -> &mut InFlight {
        // SAFETY: a slot below the pool's count (`pool::take` gives no other), lent to one
        // entry, used under that entry's partition lock.
        unsafe { &mut *self.pool.add(slot as usize) }
    }
}

static AREA: AtomicPtr<Header> = AtomicPtr::new(null_mut());
/// The lock of `Header::loaded` and `Header::shares`, the named tranche's one.
static PLACES_LOCK: AtomicPtr<pg_sys::LWLockPadded> = AtomicPtr::new(null_mut());

/// The area, when the library was preloaded with entries.
fn table() -> Option<Table> {
    // SAFETY: set by `attach` to an area of `Layout::size` bytes that lives as long as the
    // server, laid out as `Layout` says.
    unsafe {
        let header = AREA.load(Acquire).as_ref()?;
        if header.entries == 0 {
            return None;
        }
        let layout = Layout::of(header.entries as usize, header.pool_shares as usize);
        let base = (header as *const Header).cast::<u8>().cast_mut();
        Some(Table {
            header,
            changed: base.add(layout.changed).cast(),
            partitions: base.add(layout.partitions).cast(),
            entries: base.add(layout.entries).cast(),
            pool_bits: base.add(layout.pool_bits).cast(),
            pool: base.add(layout.pool).cast(),
        })
    }
}

/// Whether memory limits are on: a preloaded library with `rate_limiter.memory_keys` > 0.
pub fn enabled() -> bool {
    entry_count() > 0
}

/// The entries asked for, in whole partitions.
fn entry_count() -> usize {
    (settings::MEMORY_KEYS.get().max(0) as usize).next_multiple_of(PARTITION)
}

/// The pool's shares: none with memory limits off.
fn pool_shares() -> usize {
    if entry_count() > 0 { pool::shares() } else { 0 }
}

/// The lock of `Header::loaded` and `Header::shares`.
fn places_lock() -> *mut pg_sys::LWLock {
    // SAFETY: the named tranche's one lock (see `attach`).
    unsafe { &raw mut (*PLACES_LOCK.load(Acquire)).lock }
}

/// The entries one database may hold of `entries`, by `rate_limiter.memory_keys_per_database`.
fn share_limit(entries: usize, setting: i32) -> usize {
    match setting {
        -1 => entries / 8 * 7,
        n => (n.max(0) as usize).min(entries),
    }
}

/// The postmaster's shmem request.
///
/// # Safety
/// Only from `shmem_request_hook`.
pub unsafe fn request() {
    // SAFETY: the request hook is where both may be called.
    unsafe {
        pg_sys::RequestAddinShmemSpace(Layout::of(entry_count(), pool_shares()).size);
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 1);
    }
}

/// # Safety
/// Only from `shmem_startup_hook`, holding AddinShmemInitLock.
pub unsafe fn attach() {
    let entries = entry_count();
    let pool_shares = pool_shares();
    // SAFETY: requested with this size and these locks in `request`; a fresh area is all
    // zeros, which is a valid header, entries that are not used (numbers, zeros), a pool
    // all free and escrows whose rings hold debits of zeros.
    unsafe {
        let (area, found) = area::area(SHMEM_NAME, Layout::of(entries, pool_shares).size);
        let header = area.cast::<Header>();
        if !found {
            (*header).entries = entries as u64;
            (*header).pool_shares = pool_shares as u64;
            if entries > 0 {
                (*header).secret = identity::cluster_secret();
                (*header).tranche = pg_sys::LWLockNewTrancheId();
            }
        }
        PLACES_LOCK.store(pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr()), Release);
        // The partitions' locks have a tranche of their own: the postmaster names it for the
        // processes it starts, which inherit the name (a process that attaches instead, under
        // EXEC_BACKEND, names it again).
        if entries > 0 {
            pg_sys::LWLockRegisterTranche((*header).tranche, TRANCHE.as_ptr());
        }
        AREA.store(header, Release);
        if found {
            return;
        }
        let Some(table) = table() else { return };
        for p in 0..table.partitions() {
            let partition = table.partitions.add(p);
            pg_sys::LWLockInitialize(&raw mut (*partition).lock, (*header).tranche);
            // Zeros say "free" in the tags; in the instants it takes -inf, since a clock set
            // before 1970 reads below 0.
            (*partition).free_after = [f64::NEG_INFINITY; PARTITION];
        }
        if !pg_sys::IsUnderPostmaster {
            // The postmaster, making shared memory at start or after a crash: what the last
            // clean shutdown counted, and the counts to write at the next one.
            let in_recovery = snapshot::starts_in_recovery();
            match saved::load(&table, in_recovery) {
                Some((loaded, dropped)) => {
                    if loaded + dropped > 0 {
                        pgrx::log!("rate_limiter: {loaded} memory limit keys loaded from the last shutdown, {dropped} without room");
                    }
                }
                // A crash, or the first start: each database loads its snapshot table
                // before its first memory call.
                None => (*header).epoch.store(1, Release),
            }
            (*header).recovering.store(in_recovery, Release);
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
    let shutdown = saved::shut_down_cleanly();
    if code != 0 || shutdown == saved::Shutdown::Unclean {
        return;
    }
    if let Some(table) = table() {
        // SAFETY: the postmaster exits after every backend has: no one else uses the entries.
        match unsafe { saved::save(&table, shutdown) } {
            Ok(n) => pgrx::log!("rate_limiter: {n} memory limit keys saved for the next start"),
            Err(e) => pgrx::warning!("rate_limiter: memory limit counts not saved: {e}"),
        }
    }
}

/// (limit, key) in this database; see `Identity::new`.
pub fn identity(install: pg_sys::Oid, name: &str, key: Option<&str>, inline: Option<&[u8; 16]>) -> Option<Identity> {
    let table = table()?;
    Some(Identity::new(table.header.secret, area::my_database(), u32::from(install), name, key, inline))
}

/// This cluster's origin in the snapshot logs (`identity::snapshot_origin`); None with
/// memory limits off.
pub fn snapshot_origin() -> Option<i64> {
    Some(identity::snapshot_origin(table()?.header.secret))
}

/// The tag of limit `name`, to forget all its keys.
pub fn limit_tag(install: pg_sys::Oid, name: &str) -> Option<u64> {
    let table = table()?;
    Some(identity::limit_tag(table.header.secret, area::my_database(), u32::from(install), name))
}

/// The entries of partition `partition`.
fn range(partition: usize) -> std::ops::Range<usize> {
    partition * PARTITION..(partition + 1) * PARTITION
}

/// The entry of `id` in this database in `partitions`; when there is none, how many entries
/// of its (limit, key) count under inline configs there.
fn find(table: &Table, partitions: [usize; 2], id: &Identity) -> (Option<usize>, usize) {
    let (want, database) = (id.index_tag(), area::my_database());
    let mut inline = 0;
    let distinct = if partitions[0] == partitions[1] { 1 } else { 2 };
    for &p in &partitions[..distinct] {
        let tags = table.tags_of(p);
        for i in (0..PARTITION).filter(|i| tags[*i] == want).map(|i| p * PARTITION + i) {
            let entry = table.entry(i);
            if entry.is(database, id) {
                return (Some(i), inline);
            }
            inline += usize::from(entry.same_key(database, id) && entry.inline());
        }
    }
    (None, inline)
}

/// The entry of `id` in this database, found in one of `partitions` under that partition's
/// lock alone, which is held: most calls find their key, and both partitions are held only
/// to give one an entry (an entry changes only under its own partition's lock).
fn find_alone(table: &Table, partitions: [usize; 2], id: &Identity) -> Option<(usize, Held)> {
    let distinct = if partitions[0] == partitions[1] { 1 } else { 2 };
    partitions[..distinct].iter().find_map(|&p| {
        // SAFETY: a partition's lock, initialized by the postmaster; the only one held here.
        let held = unsafe { Held::take(table.lock(p)) };
        find(table, [p, p], id).0.map(|i| (i, held))
    })
}

/// An entry of `partitions` to give to a new key of this database at `now`: of the
/// emptier partition, and only one of its own when the database holds its share. None: no
/// room.
fn reusable(table: &Table, partitions: [usize; 2], now: f64, own_only: bool) -> Option<usize> {
    let database = area::my_database();
    // Fullness is the entries counted (a tag), expired or not: what the two choices balance.
    let used = |p: usize| table.tags_of(p).iter().filter(|t| **t != 0).count();
    let (emptier, other) =
        if used(partitions[1]) < used(partitions[0]) { (partitions[1], partitions[0]) } else { (partitions[0], partitions[1]) };
    let give = |p: usize| {
        let free_after = table.free_after_of(p);
        (0..PARTITION)
            .find(|i| free_after[*i] <= now && (!own_only || table.entry(p * PARTITION + i).database == database))
            .map(|i| p * PARTITION + i)
    };
    give(emptier).or_else(|| give(other))
}

/// An entry, its partitions' locks held until the guard drops.
pub struct Guard {
    table: Table,
    index: usize,
    _held: [Option<Held>; 2],
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Before the locks are released (the fields drop after this): an escrow whose calls
        // all settled goes back to the pool, its base to the entry.
        let entry = self.table.entry(self.index);
        if entry.in_flight != 0 {
            let slot = entry.in_flight - 1;
            if let Some((base, base_at)) = self.table.in_flight(slot).settled_base() {
                entry.set_at_rest(base, base_at);
                entry.in_flight = 0;
                pool::give_back(&self.table, slot);
                if entry.database == 0 {
                    // Orphaned (its database's counts were forgotten meanwhile).
                    entry.free();
                }
            }
        }
        self.table.refresh(self.index);
    }
}

/// What a take or a credit did with a key's entry.
pub enum Listed {
    /// Listed in flight as debit `seq` of the lent escrow (see `Guard::ticket`).
    InFlight(Admitted),
    /// No escrow to lend: decided on the committed state and kept as committed at once (a
    /// rollback gives it back nothing), or a credit that gives nothing back.
    Settled(Admitted),
}

impl Guard {
    pub fn entry_ref(&self) -> &Entry {
        self.table.entry(self.index)
    }

    /// The entry, to change: it is written at the next snapshot.
    fn entry(&mut self) -> &mut Entry {
        self.table.entry_to_change(self.index)
    }

    pub fn ticket(&self) -> Ticket {
        Ticket { index: self.index, generation: self.entry_ref().generation }
    }

    /// The escrow lent to the entry, if calls are in flight.
    pub fn in_flight(&mut self) -> Option<&mut InFlight> {
        match self.entry_ref().in_flight {
            0 => None,
            n => Some(self.table.in_flight(n - 1)),
        }
    }

    /// What calls are admitted against: the escrow's tail, or the committed state.
    pub fn tail(&mut self) -> State {
        match self.in_flight() {
            Some(f) => f.escrow_ref().tail(),
            None => self.entry_ref().at_rest().0,
        }
    }

    /// The instant a call at `now` is admitted at: never before a debit already counted.
    pub fn admission_instant(&mut self, now: f64) -> f64 {
        match self.in_flight() {
            Some(f) => f.escrow_ref().admission_instant(now),
            None => now.max(self.entry_ref().at_rest().1),
        }
    }

    /// Whether the lent escrow's ring is full: the next listing sinks the older half.
    pub fn full(&mut self) -> bool {
        self.in_flight().is_some_and(|f| f.escrow_ref().full())
    }

    /// The older half of the full ring is sunk by the next listing: counted for good.
    pub fn note_committed(&mut self) {
        self.entry().note_committed();
    }

    /// List a take (`count` > 0) or a credit (`count` < 0) in flight, with `list` given the
    /// escrow lent to the entry and the debit's number; with no escrow to lend, a take is
    /// decided on the committed state and kept, and a credit gives nothing back. A take's
    /// `planned` is its plan as the caller made it (`Escrow::admit_planned`).
    pub fn list(&mut self, config: &Config, now: f64, count: f64, reserve: bool, planned: Option<Planned>) -> (Listed, u64) {
        if self.entry_ref().in_flight == 0 {
            if let Some(slot) = pool::take(&self.table) {
                let (base, base_at) = self.entry_ref().at_rest();
                self.table.in_flight(slot).start(base, base_at);
                self.entry().in_flight = slot + 1;
            }
        }
        let Some(f) = self.in_flight() else {
            let (state, base_at) = self.entry_ref().at_rest();
            let mut escrow = Escrow::<RING, entry::Packed>::new_at(state, base_at);
            let admitted =
                if count >= 0.0 { escrow.admit_planned(config, now, count, reserve, 1, planned) } else { escrow.credit(config, now, -count, 1) };
            if count > 0.0 && admitted.seq.is_some() {
                escrow.commit(config, 1);
                let (state, base_at) = escrow.snapshot();
                let entry = self.entry();
                entry.set_at_rest(state, base_at);
                entry.note_committed();
            }
            return (Listed::Settled(Admitted { seq: None, ..admitted }), 0);
        };
        let seq = f.draw_seq();
        let escrow = f.escrow();
        let admitted =
            if count >= 0.0 { escrow.admit_planned(config, now, count, reserve, seq, planned) } else { escrow.credit(config, now, -count, seq) };
        self.entry();
        (Listed::InFlight(admitted), seq)
    }

    /// Not given away until the caller's next `settled`: between a placement and its call.
    pub fn pin(&mut self) {
        self.table.entry(self.index).expires = f64::INFINITY;
    }

    /// After a change under `config`: when the entry may be given away.
    pub fn settled(&mut self, config: &Config) {
        let tail = self.tail();
        self.entry().expires = bucket::expires(&tail, config);
    }

    /// Debit `seq` of this entry's escrow ended: committed, or taken back.
    pub fn settle(&mut self, seq: u64, committed: bool, config: &Config) {
        let Some(f) = self.in_flight() else { return };
        let tail = f.escrow_ref().tail();
        f.end_holder(seq);
        if committed {
            f.escrow().commit(config, seq);
        } else {
            f.escrow().abort(config, seq);
        }
        if committed {
            self.entry().note_committed();
        } else {
            self.entry();
        }
        // The expiry is the tail's, which the last call that changed it set: a commit that
        // leaves the tail as it was (a take's, counted since its admission) leaves it too,
        // unless a change of the limit held the entry meanwhile (an infinite expiry).
        if self.tail() != tail || self.entry_ref().expires == f64::INFINITY {
            self.settled(config);
        }
    }
}

/// Where a call's debit is, for the callbacks at its transaction's end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ticket {
    index: usize,
    generation: u32,
}

/// Whether `hold` may give a key not counted yet an entry.
#[derive(Clone, Copy, PartialEq)]
pub enum Claim {
    /// Never: only find it.
    Never,
    /// Only when none of this database's keys can be counted in a row (none ever found no
    /// room since the snapshot table's mark was looked up), so that the key has none.
    UnlessRowsMayExist,
    /// Whenever there is room (the caller made sure the key has no row that counts).
    Always,
}

/// What `hold` found.
pub enum Hold {
    Entry(Guard),
    /// Not counted here, and `Claim` gave it no entry.
    Absent,
    /// Not counted here, and no room: no free entry in its partitions, its database holds its
    /// share, or it is one inline config too many of its (limit, key). From now on this
    /// database's keys may be counted in rows.
    NoRoom,
}

/// Whether this database's memory limits may count keys in rows; `Unknown` until
/// `rows_looked_up`.
pub fn rows_may_exist() -> Rows {
    let Some(table) = table() else { return Rows::None };
    shares::of(&table, area::my_database()).map_or(Rows::Maybe, |s| s.rows())
}

/// What the snapshot table's mark said: whether keys were counted in rows before.
pub fn rows_looked_up(maybe: bool) {
    if let Some(share) = table().and_then(|t| shares::of(&t, area::my_database())) {
        share.looked_up(if maybe { Rows::Maybe } else { Rows::None });
    }
}

/// The entry of `id` in this database under the config whose fingerprint is `config`, held;
/// a key not counted yet starts from `fresh`, if `claim` lets it have an entry. A limit
/// changed since the entry was written is taken on with its state, as a durable limit's row
/// is, once nothing is in flight (a change waits for every call in flight).
pub fn hold(id: &Identity, name: &str, config: u64, now: f64, claim: Claim, fresh: impl FnOnce() -> State) -> Result<Hold> {
    let table = table().ok_or(Error::MemoryUnavailable)?;
    let partitions = id.partitions(table.partitions());
    let (found, held, inline) = match find_alone(&table, partitions, id) {
        Some((i, held)) => (Some(i), [Some(held), None], 0),
        None => {
            // Not found in either alone: looked for again under both, which a new entry takes.
            let held = table.hold_partitions(partitions);
            let (found, inline) = find(&table, partitions, id);
            (found, held, inline)
        }
    };
    let index = match found {
        Some(i) => {
            let entry = table.entry(i);
            if entry.config != config {
                if entry.in_flight != 0 {
                    return Err(Error::ConfigRace(name.to_owned()));
                }
                entry.config = config;
                if entry.absent() {
                    // Only rolled-back calls: fresh under the new config.
                    entry.set_at_rest(fresh(), f64::NEG_INFINITY);
                }
            }
            i
        }
        None => {
            let Some(share) = shares::of(&table, area::my_database()) else { return Ok(Hold::NoRoom) };
            let may = match claim {
                Claim::Never => false,
                Claim::UnlessRowsMayExist => share.rows() == Rows::None,
                Claim::Always => true,
            };
            if !may {
                return Ok(Hold::Absent);
            }
            // Computed before an entry changes hands, so that an error leaves it as it was.
            let base = fresh();
            let room = if id.variant != 0 && inline >= INLINE_VARIANTS { None } else { claim_entry(&table, partitions, now) };
            let Some(i) = room else {
                // Under the partitions' locks, before the caller counts the key in a row: a
                // call that then misses the key here looks for its row.
                share.overflowed();
                return Ok(Hold::NoRoom);
            };
            table.entry(i).claim(area::my_database(), id, config, base);
            i
        }
    };
    Ok(Hold::Entry(Guard { table, index, _held: held }))
}

/// An entry of `partitions` for a new key of this database at `now`, counted in its share
/// (the caller makes it the key's); None when there is no room.
fn claim_entry(table: &Table, partitions: [usize; 2], now: f64) -> Option<usize> {
    let database = area::my_database();
    let share = shares::of(table, database)?;
    let own_only = share.held() >= share_limit(table.count(), settings::MEMORY_KEYS_PER_DATABASE.get());
    let i = reusable(table, partitions, now, own_only)?;
    let entry = table.entry(i);
    if !entry.used() || entry.database != database {
        if entry.used() && entry.database != 0 {
            shares::add(table, entry.database, -1);
        }
        share.add(1);
    }
    Some(i)
}

/// The entry of `id` in this database, held, if it is counted.
pub fn peek(id: &Identity) -> Option<Guard> {
    let table = table()?;
    let partitions = id.partitions(table.partitions());
    let held = table.hold_partitions(partitions);
    let index = find(&table, partitions, id).0?;
    Some(Guard { table, index, _held: held })
}

/// Whether this database counts (limit, key) of `id` under any config of its name.
pub fn counts_key(id: &Identity) -> bool {
    let Some(table) = table() else { return false };
    let partitions = id.partitions(table.partitions());
    let _held = table.hold_partitions(partitions);
    let database = area::my_database();
    partitions.iter().flat_map(|p| range(*p)).any(|i| table.entry(i).same_key(database, id))
}

/// The entry of `ticket`, held, if it is still the one the ticket was taken from.
pub fn redeem(ticket: Ticket) -> Option<Guard> {
    let table = table()?;
    let p = ticket.index / PARTITION;
    let held = table.hold_partitions([p, p]);
    let entry = table.entry(ticket.index);
    (entry.used() && entry.generation == ticket.generation).then(|| Guard { table, index: ticket.index, _held: held })
}

/// Let go of entry `i` (under its partition's lock): free, or while calls are still in
/// flight in it, kept for their tickets but answering for no database any more.
fn let_go(table: &Table, i: usize) {
    let entry = table.entry(i);
    if entry.database != 0 {
        shares::add(table, entry.database, -1);
    }
    if entry.in_flight == 0 {
        entry.free();
    } else {
        entry.database = 0;
    }
    table.refresh(i);
}

/// Let go of the entries `ours` accepts, one partition at a time. With `only_idle`, an
/// entry with calls in flight is kept (a change that forgets waited for every call in
/// flight, so none is left then).
fn drop_entries(ours: impl Fn(&Entry) -> bool, only_idle: bool) {
    let Some(table) = table() else { return };
    for partition in 0..table.partitions() {
        let _held = table.hold_partitions([partition, partition]);
        for i in table.live(partition) {
            let entry = table.entry(i);
            if entry.used() && entry.database != 0 && ours(entry) && !(only_idle && entry.in_flight != 0) {
                let_go(&table, i);
            }
        }
    }
}

/// Forget the counts of a database (its limits truncated); it stays loaded.
pub fn forget_database(database: pg_sys::Oid) {
    let database = u32::from(database);
    drop_entries(|entry| entry.database == database, false);
}

/// Forget a dropped database: its counts, its share and that it loaded its snapshot, so
/// that a new database with the same OID starts empty and loads its own.
pub fn drop_database(database: pg_sys::Oid) {
    forget_database(database);
    if let Some(table) = table() {
        shares::forget(&table, u32::from(database));
    }
    snapshot::forget_database(database);
}

/// A `DROP DATABASE` of `database` began (`true`: its snapshot worker, which would keep it
/// from being dropped, ends at its next wake) or was rolled back (`false`).
pub fn database_dropping(database: pg_sys::Oid, dropping: bool) {
    if let Some(table) = table() {
        shares::set_dropping(&table, u32::from(database), dropping);
    }
}

/// Whether a `DROP DATABASE` of `database` is under way.
pub fn is_dropping(database: pg_sys::Oid) -> bool {
    table().is_some_and(|t| shares::dropping(&t, u32::from(database)))
}

/// Limit `limit` (`limit_tag`) of this database changed: its named keys' counts are taken
/// on under the configs a key of it may now be decided under (`config_tag` of each one's
/// fingerprint, and the config: the limit's own, its overrides' and tiers'). Each key equals
/// an absent key's from the latest instant any of them says, never earlier than under its
/// own; one config is the key's from now on. With none to go by, none is given away until
/// called again.
pub fn retune(limit: u64, now: &[(u64, Config)]) {
    let Some(table) = table() else { return };
    let database = area::my_database();
    for partition in 0..table.partitions() {
        let _held = table.hold_partitions([partition, partition]);
        for i in table.live(partition) {
            let entry = table.entry(i);
            if !(entry.used() && entry.database == database && entry.limit == limit && !entry.inline()) {
                continue;
            }
            match now {
                // Only rolled-back calls: as absent as a key never called.
                _ if entry.absent() => let_go(&table, i),
                [_, ..] if entry.in_flight == 0 => {
                    let entry = table.entry_to_change(i);
                    if let [(fingerprint, _)] = now {
                        entry.config = *fingerprint;
                    }
                    let state = entry.at_rest().0;
                    entry.expires = now.iter().map(|(_, config)| bucket::expires(&state, config)).fold(f64::NEG_INFINITY, f64::max);
                }
                _ => entry.expires = f64::INFINITY,
            }
            table.refresh(i);
        }
    }
}

/// A promoted standby's own count of (limit, key) of `id`, under every config of the name,
/// gives way to the primary's row of it: its entries answer for no key any more (calls of
/// it still in flight end in them).
pub fn give_way(id: &Identity) {
    let_go_key(id, false);
}

/// Forget the counts of limit `limit` (`limit_tag`) in this database, or of one key of it
/// (`id`, under every inline config of the name).
pub fn forget(limit: u64, id: Option<&Identity>) {
    let database = area::my_database();
    match id {
        Some(id) => let_go_key(id, true),
        None => drop_entries(|entry| entry.limit == limit && entry.database == database, true),
    }
}

/// Let go of the entries of (limit, key) of `id` in this database, under every config of
/// the name; with `only_idle`, those with calls in flight are kept.
fn let_go_key(id: &Identity, only_idle: bool) {
    let Some(table) = table() else { return };
    let database = area::my_database();
    let partitions = id.partitions(table.partitions());
    let _held = table.hold_partitions(partitions);
    for i in partitions.iter().flat_map(|p| range(*p)) {
        let entry = table.entry(i);
        if entry.same_key(database, id) && !(only_idle && entry.in_flight != 0) {
            let_go(&table, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What docs/memory-limits.md and `rate_limiter.memory_keys` say a key costs, and that
    /// the default holds a million keys of one database.
    #[test]
    fn a_key_takes_at_most_128_bytes_of_shared_memory() {
        const { assert!(BYTES_PER_KEY <= 128) };
        assert_eq!(BYTES_PER_KEY, 117, "the figure the setting's description and the docs give");
        let per_key = Layout::of(1 << 20, 0).size as f64 / f64::from(1 << 20);
        assert!(per_key <= 128.0, "{per_key} bytes per key, header, locks and index included");
        assert!(share_limit(1_200_000, -1) >= 1_000_000, "the default holds a million keys of one database");
    }
}
