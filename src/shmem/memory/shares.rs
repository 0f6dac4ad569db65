//! How many entries each database holds, so that one holds at most its share of the whole
//! table (`rate_limiter.memory_keys_per_database`) without a quota per partition that a
//! caller could fill. A database has a place here from its first key until it is dropped.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::*};

use super::{places_lock, Table};
use crate::shmem::area::Held;

/// A database (its OID, 0: a free place) and the entries it holds.
#[repr(C)]
pub struct Share {
    database: AtomicU32,
    held: AtomicU32,
    /// Whether keys of its memory limits may be counted in rows of rate_limiter.state (see
    /// `Rows`), as a `Rows` number.
    rows: AtomicU32,
    /// A `DROP DATABASE` of it is under way: its snapshot worker ends, and none starts.
    dropping: AtomicU32,
}

/// Whether a database's memory limits may count keys in rows, because they found no room.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rows {
    /// Not looked up since the server started (the snapshot table's mark tells).
    Unknown = 0,
    None = 1,
    Maybe = 2,
}

impl Share {
    /// As a free place has it: nothing held, rows not looked up, no drop under way.
    fn clear(&self) {
        self.held.store(0, Relaxed);
        self.rows.store(Rows::Unknown as u32, Relaxed);
        self.dropping.store(0, Relaxed);
    }

    pub fn rows(&self) -> Rows {
        match self.rows.load(Acquire) {
            1 => Rows::None,
            2 => Rows::Maybe,
            _ => Rows::Unknown,
        }
    }

    /// What the snapshot table's mark says, unless a key found no room meanwhile.
    pub fn looked_up(&self, rows: Rows) {
        let _ = self.rows.compare_exchange(Rows::Unknown as u32, rows as u32, AcqRel, Acquire);
    }

    /// A key found no room: from now on, a key not in memory may be in a row.
    pub fn overflowed(&self) {
        self.rows.store(Rows::Maybe as u32, Release);
    }

    pub fn held(&self) -> usize {
        self.held.load(Relaxed) as usize
    }

    pub fn add(&self, n: i32) {
        if n >= 0 {
            self.held.fetch_add(n as u32, Relaxed);
        } else {
            // Never below 0, should the count and the entries ever disagree.
            let _ = self.held.fetch_update(Relaxed, Relaxed, |h| Some(h.saturating_sub(n.unsigned_abs())));
        }
    }
}

thread_local! {
    /// This backend's database's place, once found.
    static MINE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The lock of the places (the named tranche's one, shared with `Header::loaded`).
fn hold() -> Held {
    // SAFETY: the places' lock, initialized by the postmaster; a caller holds it once.
    unsafe { Held::take(places_lock()) }
}

/// `database`'s place, if it has one.
fn find(table: &Table, database: u32) -> Option<&'static Share> {
    table.header.shares.iter().find(|s| s.database.load(Relaxed) == database)
}

/// `database`'s place, given a free one if it has none (under the places' lock, or in the
/// postmaster before any backend runs); None when every place is taken.
fn place(table: &Table, database: u32) -> Option<usize> {
    let shares = &table.header.shares;
    shares.iter().position(|s| s.database.load(Relaxed) == database).or_else(|| {
        let free = shares.iter().position(|s| s.database.load(Relaxed) == 0)?;
        shares[free].clear();
        shares[free].database.store(database, Relaxed);
        Some(free)
    })
}

/// `database`'s place, given one if it has none; None when every place is taken.
pub fn of(table: &Table, database: u32) -> Option<&'static Share> {
    let shares = &table.header.shares;
    if let Some(i) = MINE.get().filter(|i| shares[*i].database.load(Relaxed) == database) {
        return Some(&shares[i]);
    }
    let i = match shares.iter().position(|s| s.database.load(Relaxed) == database) {
        Some(i) => i,
        None => {
            let _held = hold();
            place(table, database)?
        }
    };
    MINE.set(Some(i));
    Some(&shares[i])
}

/// `database` holds `n` entries more (or fewer).
pub fn add(table: &Table, database: u32, n: i32) {
    if let Some(share) = find(table, database) {
        share.add(n);
    }
}

/// Whether a `DROP DATABASE` of `database` is under way.
pub fn dropping(table: &Table, database: u32) -> bool {
    find(table, database).is_some_and(|s| s.dropping.load(Acquire) != 0)
}

/// A `DROP DATABASE` of `database` began (`true`) or was rolled back (`false`).
pub fn set_dropping(table: &Table, database: u32, dropping: bool) {
    if let Some(share) = find(table, database) {
        share.dropping.store(u32::from(dropping), Release);
    }
}

/// A dropped database's place is free again.
pub fn forget(table: &Table, database: u32) {
    let _held = hold();
    if let Some(share) = find(table, database) {
        share.clear();
        share.database.store(0, Relaxed);
    }
}

/// A key of `database` loaded by the postmaster at start, before any backend (no lock).
pub fn add_at_start(table: &Table, database: u32) {
    if let Some(i) = place(table, database) {
        table.header.shares[i].add(1);
    }
}
