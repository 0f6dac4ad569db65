//! `rate_limiter.debits`, the log of hot limits (docs/hot-limits.md): one row per consuming
//! call, inserted by the caller's transaction, read back a (name, key) at a time in number
//! order through `debits_key`, and deleted once folded into the key's base row. Written
//! through the heap and index access methods, as the state is: the table must keep the
//! shape and the two indexes the extension made, and fire no trigger. Reads visit one row at
//! a time, so what a load or a fold holds does not grow with the log.

use std::ptr::null_mut;

use pgrx::pg_sys::{self, Datum};
use pgrx::prelude::*;
use pgrx::IntoDatum;

use crate::bucket::escrow::Debit;
use crate::cache;
use crate::clock;
use crate::error::Error;

use super::scan::{equal_key, text_key};
use super::server;
use super::shape::{self, Columns};
use super::{instant, prevent_writes_unless_allowed, text, Latest};

const SEQ: i32 = 1;
const KEY: i32 = 3;
const AT: i32 = 4;
const COUNT: i32 = 5;

/// Where a logged debit's row is, to delete it.
#[derive(Clone, Copy)]
pub struct RowId(pg_sys::ItemPointerData);

/// Which snapshot a read of the log uses.
#[derive(Clone, Copy)]
pub enum Seen {
    /// Every committed row, now: what folding needs.
    Now,
    /// As a snapshot other reads share (a load reads the base row with it too).
    At(pg_sys::Snapshot),
}

/// `rate_limiter.debits`, its primary key and `debits_key`, open for one call. Closed on drop.
pub struct DebitLog {
    heap: pg_sys::Relation,
    /// The primary key (seq), then `debits_key` (name, key, seq).
    indexes: [pg_sys::Relation; 2],
    infos: [*mut pg_sys::IndexInfo; 2],
    tuple_slot: *mut pg_sys::TupleTableSlot,
}

const BY_SEQ: usize = 0;
const BY_KEY: usize = 1;

impl DebitLog {
    /// Open for reading, or for writing (refused in a read-only transaction, naming
    /// `command`); 55000 in a database not yet updated to 0.5.0 (0.4.0's log has no
    /// `debits_key`; older ones have no log).
    pub fn open(write: Option<&std::ffi::CStr>) -> DebitLog {
        let Some((table, index)) = cache::relations().debits else { Error::ExtensionOutdated.raise() };
        let Some(by_key) = cache::relations().debits_key else { Error::ExtensionOutdated.raise() };
        let lockmode = match write {
            Some(command) => {
                prevent_writes_unless_allowed(command);
                pg_sys::RowExclusiveLock
            }
            None => pg_sys::AccessShareLock,
        } as pg_sys::LOCKMODE;
        // The extension's table by the OID the cache checked; locked to the end of the
        // transaction, closed once on drop.
        let heap = super::open_table(table, lockmode, "rate_limiter.debits");
        let mut log = DebitLog { heap, indexes: [null_mut(); 2], infos: [null_mut(); 2], tuple_slot: null_mut() };
        // Its indexes, each opened with the table's lock mode; closed on drop.
        log.indexes[BY_SEQ] = super::open_index(index, lockmode, "rate_limiter.debits");
        log.indexes[BY_KEY] = super::open_index(by_key, lockmode, "rate_limiter.debits");
        // SAFETY: the heap is open and locked: its descriptor, triggers and index list are
        // current.
        unsafe {
            shape::require((*heap).rd_att, "rate_limiter.debits", &shape::DEBITS, Columns::Exactly);
            let triggers = !(*heap).trigdesc.is_null() && (*(*heap).trigdesc).numtriggers > 0;
            let list = pg_sys::RelationGetIndexList(heap);
            let indexes = if list.is_null() { 0 } else { (*list).length };
            pg_sys::list_free(list);
            shape::require_plain_heap(heap, "rate_limiter.debits");
            let index_changed = !shape::index_is(log.indexes[BY_SEQ], true, &[1]) || !shape::index_is(log.indexes[BY_KEY], false, &[2, 3, 1]);
            if triggers || indexes != 2 || index_changed {
                let detail = "it has a trigger or index the extension did not create, or one of its indexes changed".to_owned();
                Error::ShapeChanged { relation: "rate_limiter.debits".into(), detail }.raise()
            }
            log.tuple_slot = pg_sys::table_slot_create(heap, null_mut());
        }
        log
    }

    /// Log `debit` of (name, key).
    pub fn insert(&mut self, name: &str, key: Option<&str>, debit: &Debit) {
        let mut values = [
            Datum::from(debit.seq as i64),
            text(name),
            key.map(text).unwrap_or(Datum::from(0)),
            instant(debit.at, "debit's instant"),
            debit.count.into_datum().expect("float8"),
        ];
        let mut nulls = [false, false, key.is_none(), false, false];
        // SAFETY: the arrays match the descriptor (shape checked at open); the table is open
        // with RowExclusiveLock.
        let tid = unsafe {
            let tuple = pg_sys::heap_form_tuple((*self.heap).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
            pg_sys::heap_insert(self.heap, tuple, pg_sys::GetCurrentCommandId(true), 0, null_mut());
            (*tuple).t_self
        };
        // Its index entries, as the executor makes them: (seq), unique (a duplicate number
        // raises 23505), and (name, key, seq).
        self.enter(BY_SEQ, tid, &mut [values[0]], &mut [false], pg_sys::IndexUniqueCheck::UNIQUE_CHECK_YES);
        self.enter(BY_KEY, tid, &mut [values[1], values[2], values[0]], &mut [false, nulls[2], false], pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO);
    }

    /// An entry in index `i` for the row at `tid`, of the index's columns `values`.
    fn enter(&mut self, i: usize, mut tid: pg_sys::ItemPointerData, values: &mut [Datum], nulls: &mut [bool], check: pg_sys::IndexUniqueCheck::Type) {
        // SAFETY: the index is open with the table's lock; `values` and `nulls` are its columns
        // in order (the indexes' shapes are the extension's, checked through the cache).
        unsafe {
            if self.infos[i].is_null() {
                self.infos[i] = pg_sys::BuildIndexInfo(self.indexes[i]);
            }
            pg_sys::index_insert(self.indexes[i], values.as_mut_ptr(), nulls.as_mut_ptr(), &mut tid, self.heap, check, false, self.infos[i]);
        }
    }

    /// Visit the logged debits of `name` (of its `key` only, when given) numbered below
    /// `below` (all when `None`), through `debits_key`: each key's in number order, the keys
    /// one after another. One row at a time, interrupts serviced between rows.
    pub fn each(
        &self,
        name: &str,
        key: Option<Option<&str>>,
        below: Option<u64>,
        seen: Seen,
        mut visit: impl FnMut(Option<&str>, &Debit, RowId),
    ) {
        let index = self.indexes[BY_KEY];
        // SAFETY: the relations and slot are open for this call; the snapshot is the latest,
        // registered while the scan runs, or one the caller keeps registered;
        // the keys compare debits_key's
        // text columns with texteq (IS NULL for the NULL key) and its int8 column with int8lt.
        unsafe {
            let latest = matches!(seen, Seen::Now).then(Latest::take);
            let snapshot = match seen {
                Seen::Now => latest.as_ref().expect("taken above").snapshot(),
                Seen::At(snapshot) => snapshot,
            };
            let mut keys = vec![equal_key(index, 1, pg_sys::F_TEXTEQ, text(name))];
            if let Some(key) = key {
                keys.push(text_key(index, 2, key));
            }
            if let Some(b) = below {
                let mut k = equal_key(index, 3, pg_sys::F_INT8LT, Datum::from(b as i64));
                k.sk_strategy = pg_sys::BTLessStrategyNumber as u16;
                keys.push(k);
            }
            let scan = server::index_beginscan(self.heap, index, snapshot, keys.len() as i32);
            pg_sys::index_rescan(scan, keys.as_mut_ptr(), keys.len() as i32, null_mut(), 0);
            while pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, self.tuple_slot) {
                check_for_interrupts!();
                // The key is read only when the scan is not of one key (a load is).
                let read_key: Option<String>;
                let row_key = match key {
                    Some(key) => key,
                    None => {
                        read_key = self.column(KEY);
                        read_key.as_deref()
                    }
                };
                let seq: i64 = self.column(SEQ).expect("NOT NULL");
                let at = self.column::<TimestampWithTimeZone>(AT).map(clock::timestamptz_ms).expect("NOT NULL");
                let count: f64 = self.column(COUNT).expect("NOT NULL");
                let debit = Debit { seq: seq as u64, at, count, committed: true };
                visit(row_key, &debit, RowId((*self.tuple_slot).tts_tid));
            }
            pg_sys::index_endscan(scan);
        }
    }

    /// Whether the log holds a debit of `name`, committed or not: one probe of `debits_key`.
    pub fn holds(&self, name: &str) -> bool {
        let index = self.indexes[BY_KEY];
        // SAFETY: as in `last_seq`; the key compares debits_key's first column with texteq.
        unsafe {
            let mut dirty: pg_sys::SnapshotData = std::mem::zeroed();
            dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
            let mut keys = [equal_key(index, 1, pg_sys::F_TEXTEQ, text(name))];
            let scan = server::index_beginscan(self.heap, index, &mut dirty, 1);
            pg_sys::index_rescan(scan, keys.as_mut_ptr(), 1, null_mut(), 0);
            let found = pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, self.tuple_slot);
            pg_sys::index_endscan(scan);
            found
        }
    }

    /// The highest number in the log, committed or not (0 when empty).
    pub fn last_seq(&self) -> u64 {
        // SAFETY: as in `read`; a dirty snapshot also sees rows of transactions in flight.
        unsafe {
            let mut dirty: pg_sys::SnapshotData = std::mem::zeroed();
            dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
            let scan = server::index_beginscan(self.heap, self.indexes[BY_SEQ], &mut dirty, 0);
            pg_sys::index_rescan(scan, null_mut(), 0, null_mut(), 0);
            let found = pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::BackwardScanDirection, self.tuple_slot);
            let seq = if found { self.column::<i64>(SEQ).expect("NOT NULL") as u64 } else { 0 };
            pg_sys::index_endscan(scan);
            seq
        }
    }

    /// Delete a logged row (folded, or reset), as `DELETE` does, publications informed; seen
    /// by this transaction's next command (`deleted`).
    pub fn delete(&self, row: RowId) {
        // SAFETY: the table is open with RowExclusiveLock; the tid is a row this transaction
        // read; simple_heap_delete waits for a concurrent deleter and raises if one won
        // (none can: a folder or a reset holds what keeps others away).
        unsafe {
            pg_sys::CheckCmdReplicaIdentity(self.heap, pg_sys::CmdType::CMD_DELETE);
            let mut tid = row.0;
            pg_sys::simple_heap_delete(self.heap, &mut tid);
        }
    }

    /// After deletes: what this transaction does next sees them.
    pub fn deleted(&self) {
        // SAFETY: inside the caller's transaction, as any command end.
        unsafe { pg_sys::CommandCounterIncrement() };
    }

    fn column<T: FromDatum>(&self, attno: i32) -> Option<T> {
        let mut isnull = false;
        // SAFETY: the slot holds a row of the log (shape checked at open); `T` is the type of
        // column `attno` there.
        unsafe { T::from_datum(pg_sys::slot_getattr(self.tuple_slot, attno, &mut isnull), isnull) }
    }
}

/// Whether this database subscribes to the log itself (a logical replica of the extension's
/// tables, not only of its limits): the publisher's folds then arrive as changes of their own.
pub fn log_is_subscribed() -> bool {
    cache::relations().debits.is_some_and(|(table, _)| super::subscribed(table))
}

impl Drop for DebitLog {
    fn drop(&mut self) {
        if super::unwinding() {
            return;
        }
        // SAFETY: each was opened by `open` and is closed once; the locks stay to the end of
        // the transaction, as the executor keeps them.
        unsafe {
            if !self.tuple_slot.is_null() {
                pg_sys::ExecDropSingleTupleTableSlot(self.tuple_slot);
            }
            for (index, info) in self.indexes.into_iter().zip(self.infos) {
                if index.is_null() {
                    continue;
                }
                if !info.is_null() {
                    server::index_insert_cleanup(index, info);
                }
                pg_sys::index_close(index, pg_sys::NoLock as _);
            }
            pg_sys::table_close(self.heap, pg_sys::NoLock as _);
        }
    }
}
