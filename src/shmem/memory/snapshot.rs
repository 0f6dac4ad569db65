//! What bounds the counts a crash or a promotion loses (docs/memory-limits.md, "Restarts and
//! crashes"): the background worker copies the entries changed since its last round out
//! of shared memory, writes them to the database's `rate_limiter.memory_snapshot`, and marks
//! them saved once that committed. Shared memory made after a crash (no file of a clean
//! shutdown), or a standby's once it is promoted, holds less than the tables: each database
//! loads its table before its first memory call, once per such loss (`Header::epoch`).

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use pgrx::pg_sys;

use crate::error::{Error, Result};
use crate::storage::{self, snapshot::{Kind, Rows}};

use super::area::{self, Held};
use super::packed::{self, Logged};
use super::record::{self, Record};
use super::{claim_entry, find, let_go, places_lock, range, table, Header, Table, PARTITION};

thread_local! {
    /// The epoch at which this backend's database was seen loaded.
    static LOADED_AT: Cell<u64> = const { Cell::new(0) };
}

/// Whether the server starts as a standby or for a targeted recovery, whose end is a
/// promotion.
pub fn starts_in_recovery() -> bool {
    ["standby.signal", "recovery.signal"].iter().any(|f| std::path::Path::new(f).exists())
}

fn hold_loaded(exclusive: bool) -> Held {
    let lock = places_lock();
    // SAFETY: the places' lock, initialized by the postmaster; held here alone.
    unsafe {
        if exclusive {
            Held::take(lock)
        } else {
            Held::share(lock)
        }
    }
}

/// A database (its OID) and the epoch it loaded at; atomics so that the header is shared
/// as it is, but read and written only under the lock (see `hold_loaded`).
#[repr(C)]
pub struct Loaded {
    database: AtomicU32,
    epoch: AtomicU64,
}

impl Loaded {
    fn is(&self, database: pg_sys::Oid, epoch: u64) -> bool {
        self.database.load(Relaxed) == u32::from(database) && self.epoch.load(Relaxed) == epoch
    }

    fn set(&self, database: pg_sys::Oid, epoch: u64) {
        self.database.store(u32::from(database), Relaxed);
        self.epoch.store(epoch, Relaxed);
    }
}

/// The epoch the counts are at: a promotion since the last call raises it first.
fn epoch(header: &Header) -> u64 {
    if header.recovering.load(Acquire) && !storage::in_recovery() {
        let _held = hold_loaded(true);
        if header.recovering.load(Acquire) {
            header.epoch.fetch_add(1, AcqRel);
            header.recovering.store(false, Release);
        }
    }
    header.epoch.load(Acquire)
}

/// Whether `database` loaded its snapshot at `epoch`.
fn loaded_at(header: &Header, database: pg_sys::Oid, epoch: u64) -> bool {
    epoch == 0 || {
        let _held = hold_loaded(false);
        header.loaded.iter().any(|l| l.is(database, epoch))
    }
}

/// Whether this database must load its snapshot table before its memory limits count: after
/// a crash or a promotion, not yet loaded. A standby counts its own calls, and loads nothing
/// until it is promoted.
pub fn needs_load() -> bool {
    let Some(table) = table() else { return false };
    let header = table.header;
    let epoch = epoch(header);
    if epoch == 0 || LOADED_AT.get() == epoch || storage::in_recovery() {
        return false;
    }
    if loaded_at(header, pg_sys::Oid::from(area::my_database()), epoch) {
        LOADED_AT.set(epoch);
        return false;
    }
    true
}

/// Load this database's snapshot log (`storage::snapshot::read`) into its entries: a
/// promoted standby's own count of a key gives way to the primary's. Records whose counts
/// equal an absent key's at `now` are skipped; a record that finds no room (within the
/// database's share) is dropped. Then this database is loaded at the current epoch; 53400
/// when too many databases loaded since the loss.
pub fn restore(log: &[(Kind, Vec<u8>)], now: f64) -> Result<Restored> {
    let Some(table) = table() else { return Ok(Restored::default()) };
    let database = area::my_database();
    let logged: Vec<Logged> = log
        .iter()
        .filter_map(|(kind, bytes)| match kind {
            Kind::Full | Kind::Changed => Some(Logged::Records(bytes)),
            Kind::Forget => Rows::of(bytes).map(Logged::Forget),
            Kind::Rows => None,
        })
        .collect();
    let (records, unreadable) = packed::replay(&logged);
    let (mut restored, mut dropped) = (0, 0);
    for record in records {
        let Some((id, config, state, base_at)) = record::parse(&record.name, &record.counts) else { continue };
        let expires = record.expires;
        if expires <= now {
            continue;
        }
        let partitions = id.partitions(table.partitions());
        let _held = table.hold_partitions(partitions);
        let found = find(&table, partitions, &id).0;
        let index = match found {
            Some(i) if table.entry(i).in_flight == 0 => Some(i),
            // A busy entry is never the one `claim` gives.
            _ => claim_entry(&table, partitions, now),
        };
        let Some(i) = index else {
            dropped += 1; // the key keeps what it has (a standby's own count)
            continue;
        };
        if let Some(busy) = found.filter(|b| *b != i) {
            // A promoted standby's own calls of the key in flight: they end in this entry,
            // which answers for no database any more, and the key takes the primary's counts
            // in another (docs/memory-limits.md).
            let_go(&table, busy);
        }
        let entry = table.entry(i);
        entry.install(database, &id, config, state, base_at, expires);
        // As written in the table: nothing to write again.
        entry.saved = entry.changes;
        table.refresh(i);
        restored += 1;
    }
    let header = table.header;
    let epoch = epoch(header);
    let _held = hold_loaded(true);
    let slots = &header.loaded;
    let slot = slots
        .iter()
        .find(|l| l.database.load(Relaxed) == database)
        .or_else(|| slots.iter().find(|l| l.epoch.load(Relaxed) < epoch));
    let Some(slot) = slot else { return Err(Error::MemoryDatabasesFull) };
    slot.set(pg_sys::Oid::from(database), epoch);
    LOADED_AT.set(epoch);
    Ok(Restored { restored, dropped, unreadable })
}

/// What a load did: keys loaded, keys without room, and rows of no format this library reads.
#[derive(Default)]
pub struct Restored {
    pub restored: usize,
    pub dropped: usize,
    pub unreadable: usize,
}

/// A dropped database's place among the loaded ones is free again.
pub fn forget_database(database: pg_sys::Oid) {
    let Some(table) = table() else { return };
    let header = table.header;
    let _held = hold_loaded(true);
    for l in header.loaded.iter().filter(|l| l.database.load(Relaxed) == u32::from(database)) {
        l.set(pg_sys::InvalidOid, 0);
    }
}

/// An entry changed since the last snapshot, as copied out.
pub struct Changed {
    index: usize,
    generation: u32,
    changes: u32,
    /// Changed since its last snapshot (else copied only for a full copy).
    changed: bool,
    pub record: Record,
}

impl Changed {
    pub fn was_changed(&self) -> bool {
        self.changed
    }
}

/// Whether `entry` has counts to write: changed since its last snapshot (or, for a full
/// copy, `every` entry), and not equal to an absent key's at `now` (there is nothing to
/// load of those: they are marked saved instead).
fn to_write(entry: &mut super::Entry, now: f64, every: bool) -> bool {
    if !entry.used() || (entry.changes == entry.saved && !every) {
        return false;
    }
    if entry.absent() || (entry.in_flight == 0 && entry.expires <= now) {
        entry.saved = entry.changes;
        return false;
    }
    true
}

/// The partitions marked changed (or `every` one), each held in turn.
fn each_changed_partition(table: &Table, every: bool, mut visit: impl FnMut(usize)) {
    for w in 0..table.partitions().div_ceil(64) {
        let all = if table.partitions() - w * 64 >= 64 { u64::MAX } else { (1u64 << (table.partitions() - w * 64)) - 1 };
        // SAFETY: `changed` holds a bit per partition, in words of 64.
        let mut bits = if every { all } else { unsafe { (*table.changed.add(w)).load(Relaxed) } };
        while bits != 0 {
            let partition = w * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let _held = table.hold_partitions([partition, partition]);
            visit(partition);
        }
    }
}

/// The databases with entries to write at `now`, of those loaded at the current epoch
/// (until it loads, a database's table holds more than its entries). A partition left with
/// none is unmarked, under its lock, which every change holds while it marks it.
pub fn databases_changed(now: f64) -> Vec<pg_sys::Oid> {
    let Some(table) = table() else { return Vec::new() };
    let mut changed = BTreeSet::new();
    each_changed_partition(&table, false, |partition| {
        let mut any = false;
        for i in range(partition) {
            let entry = table.entry(i);
            if to_write(entry, now, false) {
                any = true;
                if entry.database != 0 {
                    changed.insert(entry.database);
                }
            }
        }
        if !any {
            // SAFETY: as in `each_changed_partition`.
            unsafe { (*table.changed.add(partition / 64)).fetch_and(!(1u64 << (partition % 64)), Relaxed) };
        }
    });
    let epoch = epoch(table.header);
    changed.into_iter().map(pg_sys::Oid::from).filter(|d| loaded_at(table.header, *d, epoch)).collect()
}

/// This database's entries to write at `now` (changed, or `every` one that counts anything),
/// copied one partition at a time.
pub fn changed(now: f64, every: bool) -> Vec<Changed> {
    let Some(table) = table() else { return Vec::new() };
    let database = area::my_database();
    if !loaded_at(table.header, pg_sys::Oid::from(database), epoch(table.header)) {
        return Vec::new();
    }
    let mut changed = Vec::new();
    each_changed_partition(&table, every, |partition| {
        for index in range(partition) {
            let entry = table.entry(index);
            if entry.database == database && to_write(entry, now, every) {
                let record = record::of(&table, entry);
                let was_changed = entry.changes != entry.saved;
                changed.push(Changed { index, generation: entry.generation, changes: entry.changes, changed: was_changed, record });
            }
        }
    });
    changed
}

/// The records of `changed` packed into the snapshot's rows.
pub fn rows_of(changed: &[Changed], now: f64) -> Vec<packed::Row> {
    packed::pack(changed.iter().map(|c| &c.record), now)
}

/// `changed` committed to the table: each entry is saved as of its copy, if it is still
/// the same key and has not been saved as of a later change.
pub fn mark_saved(changed: &[Changed]) {
    let Some(table) = table() else { return };
    for c in changed {
        let p = c.index / PARTITION;
        let _held = table.hold_partitions([p, p]);
        let entry = table.entry(c.index);
        if entry.used() && entry.generation == c.generation && (c.changes.wrapping_sub(entry.saved) as i32) > 0 {
            entry.saved = c.changes;
        }
    }
}
