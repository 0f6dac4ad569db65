//! Statistics per limit name in shared memory (`rate_limiter.stats`, `rate_limiter.top_denied`).
//!
//! With `shared_preload_libraries = 'rate_limiter'` the postmaster sets aside one entry per
//! (database, name) for up to `rate_limiter.stats_max_names` of them, plus entry 0 that
//! counts what finds no room at all. Each database sees and resets its own entries only, and
//! holds at most `rate_limiter.stats_max_names_per_database` names, so no database can fill
//! the room of the others; its names beyond that are counted under its own `*other*` entry.
//! An entry is kept until the server stops or its database is dropped (its room is then
//! handed out again), so a backend
//! remembers which entry is whose and counts with atomic adds, taking no lock; only a denial
//! takes its entry's spinlock, for the few instructions that count the key in the entry's
//! `TopKeys` sketch. Nothing is
//! written to tables, and the counters start from zero when the server starts.

use std::cell::{RefCell, UnsafeCell};
use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

use pgrx::pg_sys;
use pgrx::spinlock::PgSpinLock;

use crate::call::{Decision, Reason, MAX_NAME_BYTES, OTHER};
use crate::hash;
use crate::settings;
use super::area::{self, Held};

mod top_keys;
pub use top_keys::Heavy;
use top_keys::TopKeys;


/// Entries kept apart for the `*other*` rows of databases, beyond `stats_max_names`.
const OTHER_ROWS: u32 = 64;
/// A slot whose entry's database was dropped.
const VACATED: u32 = u32::MAX;

const TRANCHE: &CStr = c"rate_limiter_stats";
const SHMEM_NAME: &CStr = c"rate_limiter stats";

/// One name's counters, the ones every call touches in its first cache line. All zeros is
/// an unused entry (and a free spinlock; `startup` initializes it anyway).
#[repr(C, align(64))]
struct Entry {
    allowed: AtomicU64,
    denied: AtomicU64,
    /// PostgreSQL timestamps (µs since 2000); 0 for never.
    last_allowed_at: AtomicI64,
    last_denied_at: AtomicI64,
    /// f64 bits, added with compare-and-swap.
    tokens_granted: AtomicU64,
    tokens_reserved: AtomicU64,
    /// Allowed calls that were answered in shadow mode (counted in `allowed` too).
    shadow_denied: AtomicU64,
    /// Calls of a memory limit counted in rows, their keys finding no room in shared memory.
    memory_in_rows: AtomicU64,
    /// Guards `top_denied`: held for one sketch update or copy, as pg_stat_statements
    /// guards its counters.
    sketch_lock: PgSpinLock<()>,
    /// Bytes of `name`; written with the name before the entry is published.
    name_len: AtomicU32,
    /// The database whose entry this is (0: entry 0, which no database's view shows);
    /// written with the name.
    database: AtomicU32,
    /// Its database was dropped: the entry answers for no database, a new database with the
    /// same OID starts without it, and its room goes to the next new name of any database.
    dropped: AtomicBool,
    stats_reset: AtomicI64,
    name: UnsafeCell<[u8; MAX_NAME_BYTES]>,
    top_denied: UnsafeCell<TopKeys>,
}

/// The shared area: this header, then `slots` hash slots, then `entry_count(max_names)` entries.
#[repr(C)]
struct Header {
    max_names: u32,
    /// A power of two, at least twice the entries: open addressing stays short.
    slots: u32,
    /// Entries handed out, `*other*` rows included; entries below it are published.
    used: AtomicU32,
    /// Entries handed out to names (not `*other*` rows); under the registry lock.
    names: AtomicU32,
    /// The lock that hands out entries.
    registry: *mut pg_sys::LWLock,
}

struct Shared {
    header: &'static Header,
    /// 1 + the index of the entry whose name hashes there; 0 for free, `VACATED` where an
    /// entry of a dropped database was (lookups go on past it, a new name may take it).
    slots: &'static [AtomicU32],
    entries: &'static [Entry],
}

// SAFETY: the shared area is mapped at the same address in every backend (forked from the
// postmaster, which set this pointer up).
static AREA: AtomicPtr<Header> = AtomicPtr::new(null_mut());

fn shared() -> Option<Shared> {
    let header = AREA.load(Acquire);
    if header.is_null() {
        return None;
    }
    // SAFETY: set by `startup` to an area laid out by `layout` for this header's sizes,
    // which lives as long as the server.
    unsafe {
        let header = &*header;
        let (slots_at, entries_at, _) = layout(header.max_names);
        let base = (header as *const Header).cast::<u8>();
        Some(Shared {
            header,
            slots: std::slice::from_raw_parts(base.add(slots_at).cast(), header.slots as usize),
            entries: std::slice::from_raw_parts(base.add(entries_at).cast(), entry_count(header.max_names)),
        })
    }
}

/// Entry 0, the names' room and the `*other*` rows.
fn entry_count(max_names: u32) -> usize {
    (1 + max_names + OTHER_ROWS) as usize
}

fn slot_count(max_names: u32) -> u32 {
    (2 * entry_count(max_names) as u32).next_power_of_two()
}

/// Offsets of the slots and entries, and the area's size, for `max_names`.
fn layout(max_names: u32) -> (usize, usize, usize) {
    let align = |n: usize, to: usize| n.div_ceil(to) * to;
    let slots_at = align(size_of::<Header>(), align_of::<AtomicU32>());
    let entries_at = align(slots_at + slot_count(max_names) as usize * size_of::<AtomicU32>(), align_of::<Entry>());
    (slots_at, entries_at, entries_at + entry_count(max_names) * size_of::<Entry>())
}

/// The postmaster's shmem request: the area and the lock that hands out entries.
///
/// # Safety
/// Only from `shmem_request_hook`.
pub unsafe fn request() {
    // SAFETY: the caller is the shmem request hook, where PostgreSQL 15 accepts these requests
    // (elsewhere it raises FATAL); MAX_NAMES cannot change after postmaster start.
    unsafe {
        pg_sys::RequestAddinShmemSpace(layout(settings::STATS_MAX_NAMES.get() as u32).2);
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 1);
    }
}

/// Create the area (at start and after a crash) or attach to it.
///
/// # Safety
/// Only from `shmem_startup_hook`, holding AddinShmemInitLock.
pub unsafe fn attach() {
    let max_names = settings::STATS_MAX_NAMES.get() as u32;
    // SAFETY: this function's own contract: from the startup hook, holding
    // AddinShmemInitLock; `request` asked for this size.
    let (area, found) = unsafe { area::area(SHMEM_NAME, layout(max_names).2) };
    // SAFETY: the caller holds AddinShmemInitLock, so nothing else touches a new area; it is
    // `layout(max_names).2` bytes, cache-line aligned by ShmemInitStruct, so the header and
    // each entry's spinlock written below lie inside it, aligned.
    unsafe {
        if !found {
            let entries = area.add(layout(max_names).1).cast::<Entry>();
            for i in 0..entry_count(max_names) {
                (&raw mut (*entries.add(i)).sketch_lock).write(PgSpinLock::new(()));
            }
            area.cast::<Header>().write(Header {
                max_names,
                slots: slot_count(max_names),
                used: AtomicU32::new(0),
                names: AtomicU32::new(0),
                registry: &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock,
            });
        }
    }
    AREA.store(area.cast::<Header>(), Release);
    if !found {
        shared().expect("just set").publish(0, pg_sys::InvalidOid, OTHER);
    }
}

fn add_f64(cell: &AtomicU64, n: f64) {
    let _ = cell.fetch_update(Relaxed, Relaxed, |bits| Some((f64::from_bits(bits) + n).to_bits()));
}

impl Shared {
    fn database(&self, i: usize) -> pg_sys::Oid {
        // Published with the name: read after `used` or a slot made the entry visible.
        pg_sys::Oid::from(self.entries[i].database.load(Relaxed))
    }

    /// Whether entry `i` is (name, key)'s of a live `database`.
    fn of_database(&self, i: usize, database: pg_sys::Oid) -> bool {
        self.database(i) == database && !self.entries[i].dropped.load(Acquire)
    }

    fn name(&self, i: usize) -> String {
        let entry = &self.entries[i];
        let len = entry.name_len.load(Acquire) as usize;
        // SAFETY: the name was written before name_len was published and is never rewritten.
        String::from_utf8_lossy(unsafe { &(&*entry.name.get())[..len] }).into_owned()
    }

    /// Give entry `i` to `name` of `database`. Under the lock that hands out entries (or in
    /// the postmaster); `i` is new (`used`) or a dropped database's, which no reader shows.
    fn publish(&self, i: usize, database: pg_sys::Oid, name: &str) {
        let entry = &self.entries[i];
        entry.name_len.store(0, Release);
        // SAFETY: entry i is not published yet (`used` is still i) or dropped, so no reader
        // shows its name; callers hold the registry lock (or are the postmaster), so no other
        // writer touches it.
        unsafe { (&mut *entry.name.get())[..name.len()].copy_from_slice(name.as_bytes()) };
        entry.database.store(database.to_u32(), Relaxed);
        entry.clear();
        entry.name_len.store(name.len() as u32, Release);
        if i as u32 >= self.header.used.load(Relaxed) {
            self.header.used.store(i as u32 + 1, Release);
        }
        entry.dropped.store(false, Release);
    }

    /// The entry of `name` in `database`: its own; a new one while there is room, in the
    /// database's share of it; else the database's `*other*`; else entry 0.
    fn find_or_add(&self, database: pg_sys::Oid, name: &str) -> usize {
        // SAFETY: the tranche's lock, initialized by the postmaster before any backend runs;
        // this backend takes it only here and releases it on return, so it does not hold it yet.
        let _held = unsafe { Held::take(self.header.registry) };
        let own = match self.find_slot(database, name) {
            Ok(i) => return i,
            Err(at) => at,
        };
        let used = self.header.used.load(Relaxed) as usize;
        let share = settings::STATS_MAX_NAMES_PER_DATABASE.get().max(1) as usize;
        if name != OTHER && (1..used).filter(|i| self.of_database(*i, database) && self.name(*i) != OTHER).count() < share {
            if let Some(i) = self.add(own, database, name) {
                return i;
            }
        }
        match self.find_slot(database, OTHER) {
            Ok(i) => i,
            Err(at) => self.add(at, database, OTHER).unwrap_or(0),
        }
    }

    /// The entry of (database, name), or the slot where it would go (the first vacated one
    /// on its way, else the free one that ends it). Under the lock.
    fn find_slot(&self, database: pg_sys::Oid, name: &str) -> Result<usize, usize> {
        self.find(database, name).map(|(_, entry)| entry)
    }

    /// As `find_slot`, with the slot of the entry found.
    fn find(&self, database: pg_sys::Oid, name: &str) -> Result<(usize, usize), usize> {
        let mask = self.header.slots as usize - 1;
        let mut at = hash::of([&database.to_u32().to_le_bytes()[..], name.as_bytes()]) as usize & mask;
        let mut vacated = None;
        // At most every slot once: vacated slots may leave none free.
        for _ in 0..self.slots.len() {
            match self.slots[at].load(Relaxed) {
                0 => return Err(vacated.unwrap_or(at)),
                VACATED => {
                    vacated.get_or_insert(at);
                }
                taken if self.of_database(taken as usize - 1, database) && self.name(taken as usize - 1) == name => {
                    return Ok((at, taken as usize - 1))
                }
                _ => {}
            }
            at = (at + 1) & mask;
        }
        Err(vacated.expect("more slots than entries: some slot is free or vacated"))
    }

    /// A new entry for (database, name) in slot `at`, if there is room: names have
    /// `stats_max_names`, `*other*` rows what is left. A dropped database's entry first, then
    /// one never used. Under the lock.
    fn add(&self, at: usize, database: pg_sys::Oid, name: &str) -> Option<usize> {
        let used = self.header.used.load(Relaxed) as usize;
        let i = (1..used)
            .find(|i| self.entries[*i].dropped.load(Relaxed))
            .or((used < self.entries.len()).then_some(used))?;
        if name != OTHER {
            if self.header.names.load(Relaxed) >= self.header.max_names {
                return None;
            }
            self.header.names.fetch_add(1, Relaxed);
        }
        self.publish(i, database, name);
        self.slots[at].store(i as u32 + 1, Relaxed);
        Some(i)
    }

    /// The published entries of this database, or of every database.
    fn of(&self, scope: Scope) -> impl Iterator<Item = usize> + '_ {
        let used = self.header.used.load(Acquire) as usize;
        // SAFETY: MyDatabaseId is written only while the backend connects, before any SQL
        // runs, and backends are single-threaded, so this read cannot race a write.
        let database = unsafe { pg_sys::MyDatabaseId };
        // Entry 0 (what no database had room for) belongs to no database's view.
        let first = if scope == Scope::EveryDatabase { 0 } else { 1 };
        (first..used).filter(move |i| match scope {
            Scope::EveryDatabase => !self.entries[*i].dropped.load(Acquire),
            _ => self.of_database(*i, database),
        })
    }
}

/// The entries of a dropped database answer for no database any more (see `Entry::dropped`),
/// and their room goes to new names. Called when `DROP DATABASE` commits, when the
/// database's backends, the only ones that remember its entries, are gone.
pub fn forget_database(database: pg_sys::Oid) {
    let Some(shared) = shared() else { return };
    // SAFETY: as in `find_or_add`: the registry lock, not held by this backend.
    let _held = unsafe { Held::take(shared.header.registry) };
    let used = shared.header.used.load(Relaxed) as usize;
    for i in (1..used).filter(|i| shared.of_database(*i, database)) {
        let name = shared.name(i);
        if let Ok((at, _)) = shared.find(database, &name) {
            shared.slots[at].store(VACATED, Relaxed);
        }
        if name != OTHER {
            shared.header.names.fetch_sub(1, Relaxed);
        }
        shared.entries[i].dropped.store(true, Release);
    }
}

fn now() -> i64 {
    crate::unguarded::current_timestamp()
}

thread_local! {
    /// This backend's map from names to entries (entries are never given back), and the
    /// last name it counted, which most calls repeat.
    static ENTRIES: RefCell<HashMap<String, usize>> = RefCell::new(HashMap::new());
    static LAST: RefCell<(String, usize)> = const { RefCell::new((String::new(), 0)) };
}

/// The most names a backend remembers the entries of; past it, it looks them up again.
const MAX_NAMES_REMEMBERED: usize = 4096;

fn entry_of(shared: &Shared, name: &str) -> usize {
    if let Some(i) = LAST.with_borrow(|(last, i)| (last == name).then_some(*i)) {
        return i;
    }
    let i = match ENTRIES.with_borrow(|e| e.get(name).copied()) {
        Some(i) => i,
        None => {
            // SAFETY: MyDatabaseId is written only while connecting, before any SQL runs, and
            // backends are single-threaded, so the read cannot race; a backend stays in one
            // database, so its maps need not say which.
            let i = shared.find_or_add(unsafe { pg_sys::MyDatabaseId }, name);
            ENTRIES.with_borrow_mut(|e| {
                // Bounded: a session calling ever new names (inline configs take any) would
                // otherwise keep one entry for each as long as it lives.
                if e.len() >= MAX_NAMES_REMEMBERED {
                    e.clear();
                }
                e.insert(name.to_owned(), i)
            });
            i
        }
    };
    LAST.with_borrow_mut(|last| {
        last.0.clear();
        last.0.push_str(name);
        last.1 = i;
    });
    i
}

/// Count one consuming call of limit `name` for `key` that `d` answered. `denied_here`:
/// this limit itself denied it (its key goes in the sketch), not only a call it was part of.
pub fn record(name: &str, key: Option<&str>, d: &Decision, denied_here: bool) {
    let Some(shared) = shared() else { return };
    if !settings::TRACK_STATS.get() {
        return;
    }
    let i = entry_of(&shared, name);
    let entry = &shared.entries[i];
    if d.ok {
        entry.allowed.fetch_add(1, Relaxed);
        if d.reason == Some(Reason::Shadow) {
            entry.shadow_denied.fetch_add(1, Relaxed);
        }
        let tokens = if d.retry_after.is_some() { &entry.tokens_reserved } else { &entry.tokens_granted };
        add_f64(tokens, d.granted);
        entry.last_allowed_at.store(now(), Relaxed);
    } else {
        entry.denied.fetch_add(1, Relaxed);
        entry.last_denied_at.store(now(), Relaxed);
        if denied_here {
            let _held = entry.sketch_lock.lock();
            // SAFETY: the sketch is only touched under its entry's lock, held here.
            unsafe { (*entry.top_denied.get()).add(key, 1) };
        }
    }
}

/// Count one call of memory limit `name` counted in its key's row, for want of room in
/// shared memory (docs/memory-limits.md).
pub fn record_overflow(name: &str) {
    let Some(shared) = shared() else { return };
    if !settings::TRACK_STATS.get() {
        return;
    }
    shared.entries[entry_of(&shared, name)].memory_in_rows.fetch_add(1, Relaxed);
}

/// Whose entries to read: the views show this database's; a superuser or a `pg_monitor`
/// member may read every database's.
#[derive(Clone, Copy, PartialEq)]
pub enum Scope {
    ThisDatabase,
    EveryDatabase,
}

/// One row of `rate_limiter.stats` (and of `stats_every_database`).
pub struct Row {
    /// InvalidOid for the row that counts what no database had room for.
    pub database: pg_sys::Oid,
    pub name: String,
    pub calls: i64,
    pub allowed: i64,
    pub denied: i64,
    pub tokens_granted: f64,
    pub tokens_reserved: f64,
    pub shadow_denied: i64,
    pub memory_in_rows: i64,
    pub last_allowed_at: Option<i64>,
    pub last_denied_at: Option<i64>,
    pub stats_reset: i64,
}

/// Whether the shared area exists (the library was preloaded).
pub fn enabled() -> bool {
    shared().is_some()
}

/// The entries of `scope`.
pub fn rows(scope: Scope) -> Vec<Row> {
    let Some(shared) = shared() else { return Vec::new() };
    // Shared: no dropped database's entry is handed out again while it is read.
    // SAFETY: as in `find_or_add`: the registry lock, not held by this backend.
    let _held = unsafe { Held::share(shared.header.registry) };
    let at = |t: &AtomicI64| Some(t.load(Relaxed)).filter(|t| *t != 0);
    shared
        .of(scope)
        .map(|i| {
            let e = &shared.entries[i];
            let (allowed, denied) = (e.allowed.load(Relaxed) as i64, e.denied.load(Relaxed) as i64);
            Row {
                database: shared.database(i),
                name: shared.name(i),
                // Not counted apart: one atomic add less per call.
                calls: allowed + denied,
                allowed,
                denied,
                tokens_granted: f64::from_bits(e.tokens_granted.load(Relaxed)),
                tokens_reserved: f64::from_bits(e.tokens_reserved.load(Relaxed)),
                shadow_denied: e.shadow_denied.load(Relaxed) as i64,
                memory_in_rows: e.memory_in_rows.load(Relaxed) as i64,
                last_allowed_at: at(&e.last_allowed_at),
                last_denied_at: at(&e.last_denied_at),
                stats_reset: e.stats_reset.load(Relaxed),
            }
        })
        .collect()
}

/// The sketch of the entries of `scope`, by database and name.
pub fn top_denied(scope: Scope) -> Vec<(pg_sys::Oid, String, Vec<Heavy>)> {
    let Some(shared) = shared() else { return Vec::new() };
    // Shared: no dropped database's entry is handed out again while it is read.
    // SAFETY: as in `find_or_add`: the registry lock, not held by this backend.
    let _held = unsafe { Held::share(shared.header.registry) };
    // SAFETY: TopKeys is integers and bytes, valid at all zeros.
    let mut copy: Box<TopKeys> = unsafe { Box::new(std::mem::zeroed()) };
    shared
        .of(scope)
        .map(|i| {
            let entry = &shared.entries[i];
            {
                let _held = entry.sketch_lock.lock();
                // SAFETY: read under the entry's lock, which is held only for the copy.
                unsafe { std::ptr::copy_nonoverlapping(entry.top_denied.get(), &mut *copy, 1) };
            }
            (shared.database(i), shared.name(i), copy.heavy())
        })
        .collect()
}

/// Zero the counters and sketch of `name` in this database (every entry of it when `None`);
/// names keep their entries. Returns how many entries were reset.
pub fn reset(name: Option<&str>) -> i64 {
    let Some(shared) = shared() else { return 0 };
    // Shared: no dropped database's entry is handed out again while it is read.
    // SAFETY: as in `find_or_add`: the registry lock, not held by this backend.
    let _held = unsafe { Held::share(shared.header.registry) };
    let mut reset = 0;
    for i in shared.of(Scope::ThisDatabase).filter(|i| name.is_none_or(|n| shared.name(*i) == n)) {
        shared.entries[i].clear();
        reset += 1;
    }
    reset
}

impl Entry {
    /// Counters and sketch to zero, counted from now.
    fn clear(&self) {
        for counter in [&self.allowed, &self.denied, &self.tokens_granted, &self.tokens_reserved, &self.shadow_denied, &self.memory_in_rows] {
            counter.store(0, Relaxed);
        }
        self.last_allowed_at.store(0, Relaxed);
        self.last_denied_at.store(0, Relaxed);
        {
            let _held = self.sketch_lock.lock();
            // SAFETY: written under the entry's lock.
            unsafe { (*self.top_denied.get()).clear() };
        }
        self.stats_reset.store(now(), Relaxed);
    }
}

// SAFETY: Entry's cells are written only as documented on each (under a lock, or before
// publication), so sharing references between threads is as sound as between backends.
unsafe impl Sync for Entry {}
// SAFETY: the header's counters are atomics and its lock pointer is into shared memory
// set up once, before any backend reads it, and never written again.
unsafe impl Sync for Header {}
