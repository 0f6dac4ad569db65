//! Committed rows of the small tables (`rate_limiter.limits`, `blocks`, `allows`, `overrides`,
//! `tiers`), read
//! through their unique indexes.

use std::ptr::null_mut;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::cache::{self, List};
use crate::config::{LimitRow, Override};
use crate::error::Error;
use super::shape::{self, Columns, Shape};

use super::scan::{probe, scan, text_key};

/// One of the extension's small tables (limits, blocks, allows) opened for lookups through its
/// unique index, as committed now: configs and blocks are read at their newest, never as of
/// an older snapshot (their caches are refilled from here after every change). Closed on
/// drop.
pub struct Lookup {
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    tuple_slot: *mut pg_sys::TupleTableSlot,
}

impl Lookup {
    /// `rate_limiter.limits`, looked up by name.
    pub fn limits() -> Lookup {
        let relations = cache::relations();
        Lookup::open(relations.limits, relations.limits_key, "rate_limiter.limits", &shape::LIMITS, &[1])
    }

    /// `rate_limiter.blocks` or `rate_limiter.allows`, looked up by (key, name); None for the
    /// allow list of a database not yet updated to 0.4.0.
    pub fn list(list: List) -> Option<Lookup> {
        let relations = cache::relations();
        let (table, index, shown) = match list {
            List::Blocks => (relations.blocks, relations.blocks_key, "rate_limiter.blocks"),
            List::Allows => {
                let (table, index) = relations.allows?;
                (table, index, "rate_limiter.allows")
            }
        };
        Some(Lookup::open(table, index, shown, &shape::LISTS, &[2, 1]))
    }

    /// `rate_limiter.overrides`, looked up by (name, key); None in a database not yet updated
    /// to 0.7.0, which has no overrides.
    pub fn overrides() -> Option<Lookup> {
        let (table, index) = cache::relations().overrides?;
        Some(Lookup::open(table, index, "rate_limiter.overrides", &shape::OVERRIDES, &[1, 2]))
    }

    /// `rate_limiter.tiers`, looked up by (name, tier); None where `overrides` is.
    pub fn tiers() -> Option<Lookup> {
        let (table, index) = cache::relations().tiers?;
        Some(Lookup::open(table, index, "rate_limiter.tiers", &shape::TIERS, &[1, 2]))
    }

    /// Open `table` and its unique `index` on `key_columns`, then check both as they are now,
    /// locked: an ALTER that committed while this call waited for the lock is seen here
    /// (`cache` checked them when it looked them up, before the lock).
    fn open(table: pg_sys::Oid, index: pg_sys::Oid, shown: &str, columns: &Shape, key_columns: &[i16]) -> Lookup {
        let lockmode = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        // Each resource goes into the struct as soon as it is opened, so that `drop` closes
        // what was opened if a later step raises.
        // Callers run inside a transaction with the cached OID. Closed once, on drop.
        let mut lookup = Lookup { heap: super::open_table(table, lockmode, shown), index: null_mut(), tuple_slot: null_mut() };
        // The cached unique index of that table, checked once the table is locked. Closed
        // once, on drop.
        lookup.index = super::open_index(index, lockmode, shown);
        // SAFETY: `lookup.heap` is open, which is all table_slot_create needs; the slot is
        // dropped once, on drop.
        lookup.tuple_slot = unsafe { pg_sys::table_slot_create(lookup.heap, null_mut()) };
        // SAFETY: the heap is open and locked, so its descriptor is current.
        unsafe { shape::require((*lookup.heap).rd_att, shown, columns, Columns::AtLeast) };
        // SAFETY: the index is open.
        if !unsafe { shape::index_is(lookup.index, true, key_columns) } {
            let detail = "its unique index is not the one the extension made".to_owned();
            Error::ShapeChanged { relation: shown.to_owned(), detail }.raise()
        }
        lookup
    }

    /// Whether a row has these values (`None`: NULL) in the index's leading text columns;
    /// it is then the current row. No values: whether there is any row.
    pub fn find(&self, values: &[Option<&str>]) -> bool {
        let mut keys = self.keys(values);
        // SAFETY: relations and slot stay open until drop; GetLatestSnapshot's snapshot stays
        // valid until the next such call, none of which happens during the probe, and the
        // transaction's own snapshot keeps the rows it sees from being pruned.
        unsafe { probe(self.heap, self.index, pg_sys::GetLatestSnapshot(), &mut keys, self.tuple_slot) }
    }

    /// Each row with these values in the index's leading text columns, current while `each`
    /// runs, until `each` answers false.
    pub fn each(&self, values: &[Option<&str>], each: impl FnMut() -> bool) {
        let mut keys = self.keys(values);
        // SAFETY: as `find`'s; `each` reads the slot only through `column`.
        unsafe { scan(self.heap, self.index, pg_sys::GetLatestSnapshot(), &mut keys, self.tuple_slot, each) }
    }

    /// Scan keys: these values (`None`: NULL) in the index's leading columns.
    fn keys(&self, values: &[Option<&str>]) -> Vec<pg_sys::ScanKeyData> {
        // SAFETY: the index is open and its leading columns are text (the callers' tables).
        values.iter().zip(1..).map(|(v, attno)| unsafe { text_key(self.index, attno, *v) }).collect()
    }

    /// Whether the table has `columns`, in their order (a column newer than the database's
    /// extension is missing until it is updated).
    pub fn has(&self, columns: &Shape) -> bool {
        // SAFETY: the heap is open and locked, so its descriptor is current.
        unsafe { shape::difference((*self.heap).rd_att, columns, Columns::AtLeast) }.is_none()
    }

    /// Column `attno` of the current row, of type `T` (the tables are the extension's).
    pub fn column<T: FromDatum>(&self, attno: i32) -> Option<T> {
        let mut isnull = false;
        // SAFETY: the slot holds the row `find` found; `T` is the column's type.
        unsafe { T::from_datum(pg_sys::slot_getattr(self.tuple_slot, attno, &mut isnull), isnull) }
    }
}

impl Lookup {
    /// The numbers of an override or a tier, in the columns from `rate` (rate, period,
    /// capacity, max_reserved, min_gap: the two tables' order).
    fn numbers_from(&self, rate: i32) -> Override {
        Override {
            rate: self.column(rate),
            period: self.column(rate + 1),
            capacity: self.column(rate + 2),
            max_reserved: self.column(rate + 3),
            min_gap: self.column(rate + 4),
        }
    }
}

impl Drop for Lookup {
    fn drop(&mut self) {
        if super::unwinding() {
            return;
        }
        // SAFETY: each was opened in `open` (null if it was not reached) and is closed once;
        // the locks stay to the end of the transaction, as the executor keeps them.
        unsafe {
            if !self.tuple_slot.is_null() {
                pg_sys::ExecDropSingleTupleTableSlot(self.tuple_slot);
            }
            if !self.index.is_null() {
                pg_sys::index_close(self.index, pg_sys::NoLock as _);
            }
            pg_sys::table_close(self.heap, pg_sys::NoLock as _);
        }
    }
}

/// The named limit's row, if any, as committed now.
pub fn load_limit(name: &str) -> Option<LimitRow> {
    let limits = Lookup::limits();
    limits.find(&[Some(name)]).then(|| limit_row(&limits))
}

/// Every named limit as committed now, with its name.
pub fn all_limits() -> Vec<(String, LimitRow)> {
    let limits = Lookup::limits();
    let mut all = Vec::new();
    limits.each(&[], || {
        all.push((limits.column(1).expect("NOT NULL column of rate_limiter.limits"), limit_row(&limits)));
        true
    });
    all
}

/// What an override gives its key.
pub enum Overriding {
    /// Numbers of its own, and whether the key is exempt.
    Numbers(Override, bool),
    /// A tier's (`rate_limiter.tiers`) numbers.
    Tier(String),
}

/// The override of `name`'s `key`, if any, as committed now, and until when.
pub fn load_override(name: &str, key: Option<&str>) -> Option<(Overriding, TimestampWithTimeZone)> {
    let overrides = Lookup::overrides()?;
    overrides.find(&[Some(name), key]).then(|| {
        let required = "NOT NULL column of rate_limiter.overrides";
        let overriding = match overrides.column(3) {
            Some(tier) => Overriding::Tier(tier),
            None => Overriding::Numbers(overrides.numbers_from(4), overrides.column(9).expect(required)),
        };
        (overriding, overrides.column(10).expect(required))
    })
}

/// The keys of `name` that have an override, as committed now (ended ones too: a call
/// finds those ended by `until`); None when there are more than `most`.
pub fn overridden_keys(name: &str, most: usize) -> Option<Vec<Option<String>>> {
    let overrides = Lookup::overrides()?;
    let mut keys = Vec::new();
    let mut within = true;
    overrides.each(&[Some(name)], || {
        within = keys.len() < most;
        if within {
            keys.push(overrides.column(2));
        }
        within
    });
    within.then_some(keys)
}

/// The numbers of `name`'s tier `tier`, if it exists, as committed now, and whether its keys
/// are exempt.
pub fn load_tier(name: &str, tier: &str) -> Option<(Override, bool)> {
    let tiers = Lookup::tiers()?;
    tiers.find(&[Some(name), Some(tier)]).then(|| {
        (tiers.numbers_from(3), tiers.column(8).expect("NOT NULL column of rate_limiter.tiers"))
    })
}

/// Whether `rate_limiter.overrides` has any row, as committed now.
pub fn any_override() -> bool {
    Lookup::overrides().is_some_and(|o| o.find(&[]))
}

/// The current row of `limits`: name, kind, rate, period, capacity, max_reserved, shards,
/// start, min_gap, mode, buckets, lock_timeout, on_lock_timeout, deny_cache, hot, enforce, tz,
/// durable;
/// NOT NULL where
/// `required`.
fn limit_row(limits: &Lookup) -> LimitRow {
    let required = "NOT NULL column of rate_limiter.limits";
    LimitRow {
        kind: limits.column(2).expect(required),
        rate: limits.column(3).expect(required),
        period: limits.column(4).expect(required),
        capacity: limits.column(5),
        max_reserved: limits.column(6),
        shards: limits.column(7).expect(required),
        start: limits.column(8),
        min_gap: limits.column(9),
        mode: limits.column(10).expect(required),
        buckets: limits.column(11),
        lock_timeout: limits.column(12),
        on_lock_timeout: limits.column(13).expect(required),
        deny_cache: limits.column(14),
        // New in 0.4.0: a database not yet updated has no hot limits.
        hot: limits.has(&shape::LIMITS_WITH_HOT) && limits.column(15).expect(required),
        // New in 0.5.0: a database not yet updated enforces every limit, in UTC.
        enforce: !limits.has(&shape::LIMITS_SINCE_0_5_0) || limits.column(16).expect(required),
        tz: if limits.has(&shape::LIMITS_SINCE_0_5_0) { limits.column(17) } else { None },
        // New in 0.6.0: a database not yet updated has only durable limits.
        durable: !limits.has(&shape::LIMITS_SINCE_0_6_0) || limits.column(18).expect(required),
    }
}
