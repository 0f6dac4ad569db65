//! The escrows of hot limits (docs/hot-limits.md) in shared memory: a fixed table of
//! `rate_limiter.hot_keys` entries, each the escrow of one (database, name, key) under an
//! LWLock of its own, and the counter that numbers the debit log.
//!
//! An entry's identity changes only while both the table's lock and the entry's lock are
//! held, so a backend that found an entry and then took its lock checks the identity again.
//! Lock order: the table's lock, then an entry's; nothing takes the table's lock while it
//! holds an entry's, and nothing waits for an entry's lock while it holds the table's (a
//! load holds its entry while it reads the log, and every call needs the table's lock). An
//! entry is given to another key only when nothing is listed in its escrow (no debit in
//! flight, none committed and unsettled), so a debit's entry stays its own until the debit
//! ends; a `Ticket` (entry and generation) finds it again. One database holds at most its
//! share of the entries (`rate_limiter.hot_keys_per_database`).

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};

use pgrx::pg_sys;

use crate::bucket::escrow::Escrow;
use crate::bucket::{Config, State};
use crate::call::{MAX_KEY_BYTES, MAX_NAME_BYTES};
use crate::error::{Error, Result};
use crate::settings;

use super::area::{self, Held};

/// Debits an escrow lists before it sinks the older half (docs/hot-limits.md).
pub const RING: usize = 4096;

/// Commits between two folds of a key's log into its base row.
pub const FOLD_EVERY: u64 = 1000;


const SHMEM_NAME: &CStr = c"rate_limiter hot keys";
const TRANCHE: &CStr = c"rate_limiter hot keys";
const IDENTITY_BYTES: usize = MAX_NAME_BYTES + MAX_KEY_BYTES;

#[repr(C)]
struct Header {
    entries: u64,
    /// The last debit number drawn.
    last_seq: AtomicU64,
    /// A clock of uses, to give away the entry used longest ago.
    uses: AtomicU64,
}

/// One hot (database, name, key) and its escrow.
#[repr(C)]
pub struct Entry {
    used: bool,
    database: pg_sys::Oid,
    has_key: bool,
    name_len: usize,
    key_len: usize,
    identity: [u8; IDENTITY_BYTES],
    /// Raised whenever the entry is given to a key or dropped: tickets of before are void.
    generation: u64,
    /// `config` and `escrow` hold the key's limit; else they are to be loaded.
    loaded: bool,
    /// Written under the entry's lock, read under the table's (to pick an entry to give away).
    last_used: AtomicU64,
    /// Debits committed since a fold of the log was last started.
    committed_since_fold: u64,
    /// A transaction is folding the log of this key (until it ends).
    folding: bool,
    config: MaybeUninit<Config>,
    escrow: MaybeUninit<Escrow<RING>>,
}

impl Entry {
    pub fn config(&self) -> &Config {
        assert!(self.loaded);
        // SAFETY: written when the entry was loaded, and `loaded` says it was.
        unsafe { self.config.assume_init_ref() }
    }

    pub fn escrow(&mut self) -> &mut Escrow<RING> {
        assert!(self.loaded);
        // SAFETY: restarted when the entry was loaded; its ring is zeroed memory or debits.
        unsafe { self.escrow.assume_init_mut() }
    }

    /// Given up: no key's any more, and tickets of before are void. Under both locks.
    fn free(&mut self) {
        self.used = false;
        self.loaded = false;
        self.folding = false;
        self.generation += 1;
    }

    /// Nothing listed and nothing sunk in flight: the tables hold all it counts.
    fn idle(&mut self) -> bool {
        !self.loaded || self.escrow().idle()
    }

    pub fn note_committed(&mut self) {
        self.committed_since_fold += 1;
    }

    /// Whether to fold the log now (every `FOLD_EVERY` commits, one folder at a time); if
    /// so, this caller is the folder until `end_fold`.
    pub fn start_fold(&mut self) -> bool {
        let start = !self.folding && self.committed_since_fold >= FOLD_EVERY;
        if start {
            self.folding = true;
            self.committed_since_fold = 0;
        }
        start
    }

    /// The folder's transaction ended; if it did not commit, the next caller folds.
    pub fn end_fold(&mut self, folded: bool) {
        self.folding = false;
        if !folded {
            self.committed_since_fold = self.committed_since_fold.max(FOLD_EVERY);
        }
    }

    fn is(&self, database: pg_sys::Oid, name: &str, key: Option<&str>) -> bool {
        self.used
            && self.database == database
            && &self.identity[..self.name_len] == name.as_bytes()
            && self.has_key == key.is_some()
            && &self.identity[self.name_len..self.name_len + self.key_len] == key.unwrap_or("").as_bytes()
    }

    fn name(&self) -> &[u8] {
        &self.identity[..self.name_len]
    }
}

/// Where a debit's escrow is, for the callbacks at its transaction's end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ticket {
    index: usize,
    generation: u64,
}

static AREA: AtomicPtr<Header> = AtomicPtr::new(null_mut());
static LOCKS: AtomicPtr<pg_sys::LWLockPadded> = AtomicPtr::new(null_mut());

fn entry_count() -> usize {
    settings::HOT_KEYS.get().max(0) as usize
}

fn size(entries: usize) -> usize {
    area::table_size::<Header, Entry>(entries)
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

/// Lock 0 is the table's, lock `1 + i` entry `i`'s.
fn lock(i: usize) -> *mut pg_sys::LWLock {
    // SAFETY: `LOCKS` holds `entries + 1` locks from the named tranche (see `attach`).
    unsafe { &raw mut (*LOCKS.load(Acquire).add(i)).lock }
}

/// The entries one database may hold, of `entries`.
fn share(entries: usize) -> usize {
    match settings::HOT_KEYS_PER_DATABASE.get() {
        -1 => entries.div_ceil(2).max(1),
        n => n.max(1) as usize,
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
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), entry_count() as i32 + 1);
    }
}

/// # Safety
/// Only from `shmem_startup_hook`, holding AddinShmemInitLock.
pub unsafe fn attach() {
    let entries = entry_count();
    // SAFETY: requested with this size and this many locks in `request`; a fresh area is all
    // zeros, which is a valid header and entries that are not used (their escrows' rings hold
    // debits of zeros, which `Escrow::restart` requires).
    unsafe {
        let (area, found) = area::area(SHMEM_NAME, size(entries));
        let header = area.cast::<Header>();
        if !found {
            (*header).entries = entries as u64;
        }
        LOCKS.store(pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr()), Release);
        AREA.store(header, Release);
    }
}

/// The next debit number (drawn under the entry's lock, so numbers ascend along each escrow).
pub fn next_seq() -> u64 {
    table().expect("available").0.last_seq.fetch_add(1, AcqRel) + 1
}

/// Numbers drawn from now on are above `seq` (a log that outlived shared memory has it).
pub fn numbers_above(seq: u64) {
    if let Some((header, _)) = table() {
        header.last_seq.fetch_max(seq, AcqRel);
    }
}

/// Entry `index`, held until the guard drops.
pub struct Guard {
    entry: *mut Entry,
    index: usize,
    _held: Held,
}

impl Guard {
    pub fn entry(&mut self) -> &mut Entry {
        // SAFETY: `entry` is in the table, and its lock is held while the guard lives.
        unsafe { &mut *self.entry }
    }

    pub fn ticket(&mut self) -> Ticket {
        Ticket { index: self.index, generation: self.entry().generation }
    }
}

fn hold_entry(index: usize) -> Guard {
    // SAFETY: an entry's lock, not held by this backend (a backend holds one entry at a time).
    guard(index, unsafe { Held::take(lock(1 + index)) })
}

/// Entry `index` if no one holds it now. Holding the table's lock, entries are taken only
/// this way: a load may hold an entry a while, and every call needs the table's lock.
fn try_hold_entry(index: usize) -> Option<Guard> {
    // SAFETY: as in `hold_entry`.
    unsafe { Held::try_take(lock(1 + index)) }.map(|held| guard(index, held))
}

fn guard(index: usize, held: Held) -> Guard {
    let (_, entries) = table().expect("available");
    // SAFETY: `index` is below the table's entries.
    Guard { entry: unsafe { entries.add(index) }, index, _held: held }
}

/// Entry `index` and the table's lock, both held, having waited for neither while holding
/// the other.
fn hold_with_table(index: usize) -> (Held, Guard) {
    loop {
        // SAFETY: the table's lock, initialized by the postmaster, not held here.
        let table = unsafe { Held::take(lock(0)) };
        if let Some(guard) = try_hold_entry(index) {
            return (table, guard);
        }
        drop(table);
        drop(hold_entry(index)); // wait for its holder, holding nothing
    }
}

fn database() -> pg_sys::Oid {
    area::my_database().into()
}

/// The escrow of (name, key) in this database, held; `load` gives its committed state, its
/// latest debit's instant and how many debits its log holds, when it is not loaded. `load`
/// runs with no lock held, so that a long log keeps nobody waiting and the caller can be
/// cancelled; the result is installed only if the entry was neither given away nor loaded
/// meanwhile (nothing is logged for a key whose escrow is not loaded, so the committed
/// state it read is still the key's).
pub fn hold(name: &str, key: Option<&str>, config: &Config, mut load: impl FnMut() -> (State, f64, u64)) -> Result<Guard> {
    let (header, entries) = table().ok_or(Error::HotUnavailable)?;
    let database = database();
    loop {
        let claimed = {
            // SAFETY: the table's lock, initialized by the postmaster, not held here.
            let _table = unsafe { Held::take(lock(0)) };
            match find(header, entries, database, name, key) {
                Some(i) => Ok(i),
                None => claim(header, entries, database, name, key)?,
            }
        };
        let index = match claimed {
            Ok(index) => index,
            Err(Busy(index)) => {
                drop(hold_entry(index)); // wait for its holder, holding nothing, and look again
                continue;
            }
        };
        let mut guard = hold_entry(index);
        let entry = guard.entry();
        if !entry.is(database, name, key) {
            continue; // given to another key between the two locks: look again
        }
        if entry.loaded && entry.config() != config {
            // A change of the limit drops its escrows when it commits, and waits for every
            // call in flight: a config that differs with nothing listed is reloaded.
            if !entry.idle() || entry.folding {
                return Err(Error::ConfigRace(name.to_owned()));
            }
            entry.loaded = false;
            entry.generation += 1; // a load in progress elsewhere read the old config
        }
        if !entry.loaded {
            let generation = entry.generation;
            drop(guard);
            let (base, base_at, debits) = load();
            let mut guard = hold_entry(index);
            let entry = guard.entry();
            if !(entry.is(database, name, key) && entry.generation == generation && !entry.loaded) {
                continue; // given away, or loaded by another caller meanwhile: look again
            }
            entry.config.write(*config);
            // SAFETY: the entry's escrow memory, whose ring holds zeros or debits.
            unsafe { Escrow::restart(entry.escrow.as_mut_ptr(), base, base_at) };
            entry.loaded = true;
            // The log as it is: a key loaded again and again is still folded.
            entry.committed_since_fold = debits;
            entry.last_used.store(header.uses.fetch_add(1, Relaxed), Relaxed);
            return Ok(guard);
        }
        entry.last_used.store(header.uses.fetch_add(1, Relaxed), Relaxed);
        return Ok(guard);
    }
}

/// The entry of (database, name, key), holding the table's lock.
fn find(header: &Header, entries: *mut Entry, database: pg_sys::Oid, name: &str, key: Option<&str>) -> Option<usize> {
    // SAFETY: the entries are in shared memory for the server's life; identities are read
    // under the table's lock, which any change of identity holds.
    (0..header.entries as usize).find(|i| unsafe { (*entries.add(*i)).is(database, name, key) })
}

/// An entry for (database, name, key), holding the table's lock: a free one, else the one
/// used longest ago that has nothing listed; once the database holds its share, only one of
/// its own. 53400 if none is left.
fn claim(
    header: &Header,
    entries: *mut Entry,
    database: pg_sys::Oid,
    name: &str,
    key: Option<&str>,
) -> Result<std::result::Result<usize, Busy>> {
    let count = header.entries as usize;
    // SAFETY: as below: identities read under the table's lock.
    let held = (0..count).filter(|i| unsafe { (*entries.add(*i)).used && (*entries.add(*i)).database == database }).count();
    let share = share(count);
    let own_only = held >= share;
    let by_age = {
        // Each entry's age read once: `last_used` changes under the entry's lock alone, and a
        // sort whose keys change under it may panic.
        // SAFETY: entries below the count, under the table's lock, which every write of `used`
        // holds; `last_used` is atomic. Only an order to try: checked under each entry's lock.
        let mut ages: Vec<(bool, u64, usize)> =
            (0..count).map(|i| unsafe { ((*entries.add(i)).used, (*entries.add(i)).last_used.load(Relaxed), i) }).collect();
        ages.sort_unstable();
        ages.into_iter().map(|(_, _, i)| i).collect::<Vec<usize>>()
    };
    // SAFETY: as above.
    let candidate = |i: usize| !own_only || unsafe { (*entries.add(i)).used && (*entries.add(i)).database == database };
    let mut busy = None;
    for index in by_age.into_iter().filter(|i| candidate(*i)) {
        let Some(mut guard) = try_hold_entry(index) else {
            busy = busy.or(Some(index));
            continue;
        };
        let entry = guard.entry();
        if entry.used && (!entry.idle() || entry.folding) {
            continue;
        }
        entry.used = true;
        entry.database = database;
        entry.name_len = name.len();
        entry.has_key = key.is_some();
        let key = key.unwrap_or("");
        entry.key_len = key.len();
        entry.identity[..name.len()].copy_from_slice(name.as_bytes());
        entry.identity[name.len()..name.len() + key.len()].copy_from_slice(key.as_bytes());
        entry.generation += 1;
        entry.loaded = false;
        entry.folding = false;
        entry.last_used.store(header.uses.fetch_add(1, Relaxed), Relaxed);
        return Ok(Ok(index));
    }
    match busy {
        Some(index) => Ok(Err(Busy(index))),
        None if own_only => Err(Error::HotKeysShareFull(share)),
        None => Err(Error::HotKeysFull),
    }
}

/// No entry could be claimed without waiting for this one's holder.
struct Busy(usize);

/// The escrow of (name, key) in this database, held, if it is loaded.
pub fn peek(name: &str, key: Option<&str>) -> Option<Guard> {
    let (header, entries) = table()?;
    let database = database();
    let index = {
        // SAFETY: as in `hold`.
        let _table = unsafe { Held::take(lock(0)) };
        find(header, entries, database, name, key)?
    };
    let mut guard = hold_entry(index);
    let entry = guard.entry();
    (entry.is(database, name, key) && entry.loaded).then_some(guard)
}

/// The entry of `ticket`, held, if it is still the one the ticket was taken from.
pub fn redeem(ticket: Ticket) -> Option<Guard> {
    table()?;
    let mut guard = hold_entry(ticket.index);
    let entry = guard.entry();
    (entry.used && entry.loaded && entry.generation == ticket.generation).then_some(guard)
}

/// The entries whose identity `pred` accepts, read under the table's lock alone (identities
/// change only under both locks): only those are then locked, each held as it is checked again.
fn matching(pred: impl Fn(&Entry) -> bool) -> Vec<usize> {
    let Some((header, entries)) = table() else { return Vec::new() };
    // SAFETY: the table's lock, not held here.
    let _table = unsafe { Held::take(lock(0)) };
    // SAFETY: entries below the count; `pred` reads identities, written only under this lock.
    (0..header.entries as usize).filter(|i| pred(unsafe { &*entries.add(*i) })).collect()
}

/// Drop the escrows of a dropped database: an idle one is freed; one still listing debits
/// (of a session the drop ended, not yet settled) keeps them for its tickets but answers for
/// no database any more, and is given away once idle. A new database with the same OID
/// loads its own.
pub fn forget_database(database: pg_sys::Oid) {
    for index in matching(|entry| entry.used && entry.database == database) {
        let (_table, mut guard) = hold_with_table(index);
        let entry = guard.entry();
        if entry.used && entry.database == database {
            if entry.idle() {
                entry.free();
            } else {
                entry.database = pg_sys::InvalidOid;
            }
        }
    }
}

/// Drop the escrows of `name` in this database (of its `key` only, when given; of every name
/// when `name` is `None`): they are loaded again from the tables. Only idle escrows are
/// dropped; a change that drops one waited for every call in flight (docs/hot-limits.md).
pub fn forget(name: Option<&str>, key: Option<Option<&str>>) {
    let database = database();
    let ours = |entry: &Entry| match (name, key) {
        (Some(name), Some(key)) => entry.is(database, name, key),
        (Some(name), None) => entry.used && entry.database == database && entry.name() == name.as_bytes(),
        (None, _) => entry.used && entry.database == database,
    };
    for index in matching(ours) {
        let (_table, mut guard) = hold_with_table(index);
        let entry = guard.entry();
        if ours(entry) && entry.idle() {
            entry.free();
        }
    }
}
