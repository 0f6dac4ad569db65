//! Finding, locking and writing rows of `rate_limiter.state`, and reading
//! `rate_limiter.limits`, through PostgreSQL's index and heap access methods rather than SQL.
//! A call is one index probe and, when it takes tokens, one heap update (HOT: no indexed
//! column changes): what `UPDATE ... WHERE key = $1` does, without parsing, planning or
//! executor start-up. The limiter's functions are the only way into these tables, so no
//! table privilege is checked here; EXECUTE on the function is the permission.
//!
//! Visibility is what an UPDATE in the caller's transaction would see: reads use a fresh
//! snapshot at READ COMMITTED, the transaction's otherwise, and see this transaction's
//! earlier writes; a row changed by a transaction
//! that committed after the snapshot is waited for and its newest version used at READ
//! COMMITTED, and is a serialization failure at REPEATABLE READ and SERIALIZABLE.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::ptr::null_mut;

use pgrx::pg_sys::{self, Datum, ItemPointerData, TM_Result};
use pgrx::prelude::*;
use pgrx::IntoDatum;

use crate::bucket::State;
use crate::cache;
use crate::clock;
use crate::config::LimitRow;
use crate::error::Error;

/// Identifies one shard of one limit.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    pub name: &'a str,
    pub key: Option<&'a str>,
    pub shard: i32,
}

/// A stored state and where it is.
#[derive(Clone, Copy)]
pub struct Row {
    pub state: State,
    tid: ItemPointerData,
}

pub enum Written {
    Done,
    /// Another transaction holds the row (only without waiting).
    Busy,
    /// A transaction that committed after this statement's snapshot changed the row:
    /// lock it to read its newest version.
    Moved,
}

pub enum Locked {
    Row(Row),
    Busy,
    /// Deleted meanwhile (by `reset_rate_limit`).
    Gone,
}

pub enum Created {
    Done(Row),
    /// A concurrent transaction created it first.
    Exists(Row),
    /// Another transaction is creating or deleting it (only without waiting).
    Busy,
}

// Columns of rate_limiter.state (name, key, shard, value, ts; see sql/bootstrap.sql), and
// of its unique index, which leads with key: keys tell rows apart at the first comparison.
const VALUE: i16 = 4;
const TS: i16 = 5;
const INDEX_KEY: i16 = 1;
const INDEX_NAME: i16 = 2;
const INDEX_SHARD: i16 = 3;
/// `field4` of the advisory lock tag that serializes creators of one row; `pg_advisory_lock`
/// uses 1 and 2, so user locks never collide with it.
const CREATE_LOCK_SPACE: u16 = 0x524c; // "RL"

fn xact_snapshot_isolation() -> bool {
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

fn text(s: &str) -> Datum {
    s.into_datum().expect("text is never NULL")
}

/// `rate_limiter.state` and its unique index, open for one call, with the snapshot the call
/// reads with. Closed by `close`; an error instead leaves the cleanup to the abort.
pub struct StateTable {
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    tuple_slot: *mut pg_sys::TupleTableSlot,
}

impl StateTable {
    /// Open for reading, or for writing (which a read-only transaction refuses, with
    /// `command` named in the error).
    pub fn open(write: Option<&std::ffi::CStr>) -> StateTable {
        // Cached OIDs are stale once the extension was dropped and created again elsewhere.
        unsafe { pg_sys::AcceptInvalidationMessages() };
        let relations = cache::relations();
        unsafe {
            let lockmode = match write {
                Some(command) => {
                    pg_sys::PreventCommandIfReadOnly(command.as_ptr());
                    pg_sys::RowExclusiveLock
                }
                None => pg_sys::AccessShareLock,
            } as pg_sys::LOCKMODE;
            let heap = pg_sys::table_open(relations.state, lockmode);
            let index = pg_sys::index_open(relations.state_key, lockmode);
            // As SPI does for each statement of a VOLATILE function: a fresh snapshot at
            // READ COMMITTED, that also sees this transaction's earlier commands.
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
            pg_sys::UpdateActiveSnapshotCommandId();
            StateTable {
                heap,
                index,
                snapshot: pg_sys::GetActiveSnapshot(),
                tuple_slot: pg_sys::table_slot_create(heap, null_mut()),
            }
        }
    }

    pub fn close(self) {
        unsafe {
            pg_sys::ExecDropSingleTupleTableSlot(self.tuple_slot);
            pg_sys::PopActiveSnapshot();
            pg_sys::index_close(self.index, pg_sys::NoLock as _);
            pg_sys::table_close(self.heap, pg_sys::NoLock as _);
        }
    }

    /// The row of `slot` as of the call's snapshot.
    pub fn read(&self, slot: Slot<'_>) -> Option<Row> {
        self.find(slot, self.snapshot)
    }

    fn find(&self, slot: Slot<'_>, snapshot: pg_sys::Snapshot) -> Option<Row> {
        unsafe {
            let mut keys = slot_keys(self.index, slot);
            probe(self.heap, self.index, snapshot, &mut keys, self.tuple_slot).then(|| self.slot_row())
        }
    }

    unsafe fn slot_row(&self) -> Row {
        let attr = |n: i16| {
            let mut isnull = false;
            let d = pg_sys::slot_getattr(self.tuple_slot, n.into(), &mut isnull);
            assert!(!isnull, "rate_limiter.state.value and ts are NOT NULL");
            d
        };
        let value = f64::from_bits(attr(VALUE).value() as u64);
        let ts = clock::pg_us_to_ms(attr(TS).value() as i64);
        Row { state: State { value, ts }, tid: (*self.tuple_slot).tts_tid }
    }

    /// Write `state` over `row`. Without `wait`, gives up when another transaction holds it.
    pub fn update(&self, row: &Row, slot: Slot<'_>, state: State, wait: bool) -> Written {
        unsafe {
            let tuple = self.form(slot, state);
            let mut tid = row.tid;
            let mut failure: pg_sys::TM_FailureData = std::mem::zeroed();
            let mut lockmode = pg_sys::LockTupleMode::LockTupleNoKeyExclusive;
            let cid = pg_sys::GetCurrentCommandId(true);
            let result =
                pg_sys::heap_update(self.heap, &mut tid, tuple, cid, null_mut(), wait, &mut failure, &mut lockmode);
            match result {
                TM_Result::TM_Ok => {
                    // A HOT update needs no new index entry; one that moved to another page
                    // does. It skips the uniqueness check: the slot is unchanged and this
                    // transaction holds its only live version.
                    let heap_only = (*(*tuple).t_data).t_infomask2 & pg_sys::HEAP_ONLY_TUPLE as u16 != 0;
                    if !heap_only {
                        let check = pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO;
                        self.index_insert(slot, &mut (*tuple).t_self, check, true);
                    }
                    // Later calls in this statement must see this version.
                    pg_sys::CommandCounterIncrement();
                    Written::Done
                }
                TM_Result::TM_BeingModified | TM_Result::TM_WouldBlock if !wait => Written::Busy,
                TM_Result::TM_Updated | TM_Result::TM_Deleted if xact_snapshot_isolation() => {
                    Error::SerializationFailure.raise()
                }
                TM_Result::TM_Updated | TM_Result::TM_Deleted => Written::Moved,
                other => error!("rate_limiter: unexpected heap_update result {other}"),
            }
        }
    }

    /// Lock the newest version of `row` (`FOR NO KEY UPDATE`). Without `wait`, gives up
    /// when another transaction holds it.
    pub fn lock(&self, row: &Row, wait: bool) -> Locked {
        unsafe {
            let mut tid = row.tid;
            let mut failure: pg_sys::TM_FailureData = std::mem::zeroed();
            let follow = if xact_snapshot_isolation() { 0 } else { pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION };
            let policy = if wait { pg_sys::LockWaitPolicy::LockWaitBlock } else { pg_sys::LockWaitPolicy::LockWaitSkip };
            let result = pg_sys::table_tuple_lock(
                self.heap,
                &mut tid,
                self.snapshot,
                self.tuple_slot,
                pg_sys::GetCurrentCommandId(true),
                pg_sys::LockTupleMode::LockTupleNoKeyExclusive,
                policy,
                follow as u8,
                &mut failure,
            );
            match result {
                TM_Result::TM_Ok => Locked::Row(self.slot_row()),
                TM_Result::TM_WouldBlock => Locked::Busy,
                TM_Result::TM_Updated | TM_Result::TM_Deleted if xact_snapshot_isolation() => {
                    Error::SerializationFailure.raise()
                }
                TM_Result::TM_Deleted => Locked::Gone,
                other => error!("rate_limiter: unexpected table_tuple_lock result {other}"),
            }
        }
    }

    /// Create the row of `slot` holding `state`, unless a concurrent transaction has just
    /// created it: then return that row once its creator has committed. Without `wait`,
    /// returns `Busy` instead of waiting for such a creator.
    ///
    /// This is INSERT ... ON CONFLICT DO NOTHING's speculative insertion, in two steps.
    /// First insert speculatively, asking the unique index only whether another row might
    /// exist; almost always none does, and that is all. Otherwise take the row back (it
    /// vanishes at once, so nobody waits for it), and take turns with the other creators of
    /// this row on an advisory lock, held only while looking (with a snapshot that also sees
    /// uncommitted rows) and inserting again; waits happen outside it.
    pub fn create(&self, slot: Slot<'_>, state: State, wait: bool) -> Created {
        if let Some(row) = self.insert_if_unique(slot, state) {
            return Created::Done(row);
        }
        unsafe {
            let mut hasher = DefaultHasher::new();
            (slot.name, slot.key, slot.shard).hash(&mut hasher);
            let hash = hasher.finish();
            let tag = pg_sys::LOCKTAG {
                locktag_field1: pg_sys::MyDatabaseId.into(),
                locktag_field2: (hash >> 32) as u32,
                locktag_field3: hash as u32,
                locktag_field4: CREATE_LOCK_SPACE,
                locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
                locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
            };
            let mode = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;
            loop {
                pg_sys::LockAcquire(&tag, mode, false, false);
                let mut dirty: pg_sys::SnapshotData = std::mem::zeroed();
                dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
                let found = self.find(slot, &mut dirty);
                let created = if found.is_none() { self.insert_if_unique(slot, state) } else { None };
                pg_sys::LockRelease(&tag, mode, false);
                let Some(row) = found else {
                    match created {
                        Some(row) => return Created::Done(row),
                        None => continue, // an optimistic creator got in first: look again
                    }
                };
                let (inserter, updater) = (dirty.xmin, dirty.xmax);
                if inserter != pg_sys::InvalidTransactionId || updater != pg_sys::InvalidTransactionId {
                    if !wait {
                        return Created::Busy;
                    }
                    let mut tid = row.tid;
                    if dirty.speculativeToken != 0 {
                        // Mid-insertion: it is confirmed or taken back in a moment.
                        pg_sys::SpeculativeInsertionWait(inserter, dirty.speculativeToken);
                    } else {
                        let running = if inserter != pg_sys::InvalidTransactionId { inserter } else { updater };
                        pg_sys::XactLockTableWait(running, self.heap, &mut tid, pg_sys::XLTW_Oper::XLTW_InsertIndex);
                    }
                    continue; // look again
                }
                if xact_snapshot_isolation() && self.read(slot).is_none() {
                    Error::SerializationFailure.raise()
                }
                return Created::Exists(row);
            }
        }
    }

    /// Insert the row speculatively; `None` (and the row taken back) if another live or
    /// uncommitted row of the slot might exist.
    fn insert_if_unique(&self, slot: Slot<'_>, state: State) -> Option<Row> {
        unsafe {
            let xid = pg_sys::GetCurrentTransactionId();
            let token = pg_sys::SpeculativeInsertionLockAcquire(xid);
            let tuple = self.form(slot, state);
            // HeapTupleHeaderSetSpeculativeToken: the token waits in t_ctid until confirmed.
            let ctid = &mut (*(*tuple).t_data).t_ctid;
            ctid.ip_blkid.bi_hi = (token >> 16) as u16;
            ctid.ip_blkid.bi_lo = token as u16;
            ctid.ip_posid = pg_sys::SpecTokenOffsetNumber as u16;
            let cid = pg_sys::GetCurrentCommandId(true);
            pg_sys::heap_insert(self.heap, tuple, cid, pg_sys::HEAP_INSERT_SPECULATIVE as i32, null_mut());
            let mut tid = (*tuple).t_self;
            let unique = self.index_insert(slot, &mut tid, pg_sys::IndexUniqueCheck::UNIQUE_CHECK_PARTIAL, false);
            if unique {
                pg_sys::heap_finish_speculative(self.heap, &mut tid);
            } else {
                pg_sys::heap_abort_speculative(self.heap, &mut tid);
            }
            pg_sys::SpeculativeInsertionLockRelease(xid);
            // Later calls in this statement must see the row.
            pg_sys::CommandCounterIncrement();
            unique.then_some(Row { state, tid })
        }
    }

    unsafe fn form(&self, slot: Slot<'_>, state: State) -> pg_sys::HeapTuple {
        let mut values = [
            text(slot.name),
            slot.key.map(text).unwrap_or(Datum::from(0)),
            Datum::from(slot.shard as i16),
            state.value.into_datum().expect("float8"),
            Datum::from(clock::ms_to_pg_us(state.ts)),
        ];
        let mut nulls = [false, slot.key.is_none(), false, false, false];
        pg_sys::heap_form_tuple((*self.heap).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr())
    }

    /// Add the index entry of a new row version; false if the index found another live or
    /// uncommitted row of the slot (only with `UNIQUE_CHECK_PARTIAL`).
    unsafe fn index_insert(
        &self,
        slot: Slot<'_>,
        tid: pg_sys::ItemPointer,
        check: pg_sys::IndexUniqueCheck::Type,
        unchanged: bool,
    ) -> bool {
        let mut values = [slot.key.map(text).unwrap_or(Datum::from(0)), text(slot.name), Datum::from(slot.shard as i16)];
        let mut nulls = [slot.key.is_none(), false, false];
        pg_sys::index_insert(
            self.index,
            values.as_mut_ptr(),
            nulls.as_mut_ptr(),
            tid,
            self.heap,
            check,
            unchanged,
            pg_sys::BuildIndexInfo(self.index),
        )
    }
}

/// Look `keys` up in `index` as of `snapshot`; true when a visible row was found, which is
/// then in `tuple_slot`. Each index is unique, so the first match is the only one.
unsafe fn probe(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    keys: &mut [pg_sys::ScanKeyData],
    tuple_slot: *mut pg_sys::TupleTableSlot,
) -> bool {
    let scan = pg_sys::index_beginscan(heap, index, snapshot, keys.len() as _, 0);
    pg_sys::index_rescan(scan, keys.as_mut_ptr(), keys.len() as _, null_mut(), 0);
    let found = pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, tuple_slot);
    pg_sys::index_endscan(scan);
    found
}

/// `index` column `attno` equals `value`, compared by `procedure` in the column's collation.
unsafe fn equal_key(index: pg_sys::Relation, attno: i16, procedure: u32, value: Datum) -> pg_sys::ScanKeyData {
    let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
    pg_sys::ScanKeyEntryInitialize(
        &mut key,
        0,
        attno,
        pg_sys::BTEqualStrategyNumber as u16,
        pg_sys::InvalidOid,
        *(*index).rd_indcollation.add(attno as usize - 1),
        procedure.into(),
        value,
    );
    key
}

/// Equality keys on (key, name, shard); a NULL key matches the NULL key (the index is
/// NULLS NOT DISTINCT).
unsafe fn slot_keys(index: pg_sys::Relation, slot: Slot<'_>) -> [pg_sys::ScanKeyData; 3] {
    let key = match slot.key {
        Some(k) => equal_key(index, INDEX_KEY, pg_sys::F_TEXTEQ, text(k)),
        None => {
            let mut is_null: pg_sys::ScanKeyData = std::mem::zeroed();
            pg_sys::ScanKeyEntryInitialize(
                &mut is_null,
                (pg_sys::SK_ISNULL | pg_sys::SK_SEARCHNULL) as i32,
                INDEX_KEY,
                0,
                pg_sys::InvalidOid,
                pg_sys::InvalidOid,
                pg_sys::InvalidOid,
                Datum::from(0),
            );
            is_null
        }
    };
    [
        key,
        equal_key(index, INDEX_NAME, pg_sys::F_TEXTEQ, text(slot.name)),
        equal_key(index, INDEX_SHARD, pg_sys::F_INT2EQ, Datum::from(slot.shard as i16)),
    ]
}

/// The named limit's row, if any, as committed now (the config cache is refilled from here
/// after every change, so it must not see an older snapshot's version).
pub fn load_limit(name: &str) -> Option<LimitRow> {
    let relations = cache::relations();
    unsafe {
        let lockmode = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let heap = pg_sys::table_open(relations.limits, lockmode);
        let index = pg_sys::index_open(relations.limits_key, lockmode);
        let mut keys = [equal_key(index, 1, pg_sys::F_TEXTEQ, text(name))];
        let tuple_slot = pg_sys::table_slot_create(heap, null_mut());
        let row = probe(heap, index, pg_sys::GetLatestSnapshot(), &mut keys, tuple_slot).then(|| limit_row(tuple_slot));
        pg_sys::ExecDropSingleTupleTableSlot(tuple_slot);
        pg_sys::index_close(index, pg_sys::NoLock as _);
        pg_sys::table_close(heap, pg_sys::NoLock as _);
        row
    }
}

/// Columns of rate_limiter.limits, in order: name, kind, rate, period, capacity,
/// max_reserved, shards, start; NOT NULL where `required`.
unsafe fn limit_row(tuple_slot: *mut pg_sys::TupleTableSlot) -> LimitRow {
    fn column<T: FromDatum>(tuple_slot: *mut pg_sys::TupleTableSlot, attno: i32) -> Option<T> {
        let mut isnull = false;
        unsafe { T::from_datum(pg_sys::slot_getattr(tuple_slot, attno, &mut isnull), isnull) }
    }
    let required = "NOT NULL column of rate_limiter.limits";
    LimitRow {
        kind: column(tuple_slot, 2).expect(required),
        rate: column(tuple_slot, 3).expect(required),
        period: column(tuple_slot, 4).expect(required),
        capacity: column(tuple_slot, 5),
        max_reserved: column(tuple_slot, 6),
        shards: column(tuple_slot, 7).expect(required),
        start: column(tuple_slot, 8),
    }
}

/// Forget every shard of (name, key). Plain SQL: rare, and not on the path of a decision.
pub fn delete(name: &str, key: Option<&str>) {
    let key_where = match key {
        Some(_) => "key OPERATOR(pg_catalog.=) $2",
        None => "$2::pg_catalog.text IS NULL AND key IS NULL",
    };
    let sql = format!("DELETE FROM rate_limiter.state WHERE name OPERATOR(pg_catalog.=) $1 AND {key_where}");
    Spi::run_with_args(&sql, &[name.into(), key.into()]).unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Insert or replace a named limit.
pub fn upsert_limit(row: &LimitRow, name: &str) {
    let sql = "INSERT INTO rate_limiter.limits AS l \
               (name, kind, rate, period, capacity, max_reserved, shards, start) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
               ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, rate = excluded.rate, \
               period = excluded.period, capacity = excluded.capacity, \
               max_reserved = excluded.max_reserved, shards = excluded.shards, start = excluded.start";
    let args: [pgrx::datum::DatumWithOid<'_>; 8] = [
        name.into(),
        row.kind.as_str().into(),
        row.rate.into(),
        row.period.into(),
        row.capacity.into(),
        row.max_reserved.into(),
        row.shards.into(),
        row.start.into(),
    ];
    Spi::run_with_args(sql, &args).unwrap_or_else(|e| panic!("{sql}: {e}"));
}
