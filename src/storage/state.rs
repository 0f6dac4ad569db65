//! Finding, locking and writing rows of `rate_limiter.state` through PostgreSQL's index and
//! heap access methods rather than SQL. A call is one index probe and, when it takes tokens,
//! one heap update (HOT: no indexed column changes): what `UPDATE ... WHERE key = $1` does,
//! without parsing, planning or executor start-up.
//!
//! Visibility is what an UPDATE in the caller's transaction would see: reads use a fresh
//! snapshot at READ COMMITTED, the transaction's otherwise, and see this transaction's
//! earlier writes; a row changed by a transaction that committed after the snapshot is
//! waited for and its newest version used at READ COMMITTED, and is a serialization failure
//! at REPEATABLE READ and SERIALIZABLE. The fold of a hot limit's log alone reads and locks
//! the newest rows at every level (`open_newest`).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::ptr::null_mut;

use pgrx::pg_sys::{self, Datum, TM_Result};
use pgrx::prelude::*;
use pgrx::IntoDatum;

use crate::bucket::{Counts, State};
use crate::cache;
use crate::clock;
use crate::error::Error;

use super::row::{Created, Locked, Row, Slot, Written};
use super::scan::{equal_key, probe, text_key};
use super::server::{self, NewIndexEntries};
use super::shape;
use super::{instant, prevent_writes_unless_allowed, text, xact_snapshot_isolation};

// Columns of rate_limiter.state (name, key, shard, value, ts, expires, counts, granted_at;
// see sql/bootstrap.sql), and of its unique index, which leads with key: keys tell rows
// apart at the first comparison.
const VALUE: i16 = 4;
const TS: i16 = 5;
const COUNTS: i16 = 7;
const GRANTED_AT: i16 = 8;
/// The unique index's columns as table column numbers: (key, name, shard).
const INDEX_COLUMNS: [i16; 3] = [2, 1, 3];
const INDEX_KEY: i16 = 1;
const INDEX_NAME: i16 = 2;
const INDEX_SHARD: i16 = 3;
/// `field4` of the advisory lock tag that serializes creators of one row; `pg_advisory_lock`
/// uses 1 and 2, so user locks never collide with it.
const CREATE_LOCK_SPACE: u16 = 0x524c; // "RL"

/// One index of `rate_limiter.state` that writes keep up to date: the unique index, or a
/// copy of it that `REINDEX CONCURRENTLY` or a repack is building or retiring.
struct StateIndex {
    relation: pg_sys::Relation,
    /// Built on the first entry this call inserts (most calls insert none: HOT updates).
    info: std::cell::Cell<*mut pg_sys::IndexInfo>,
    /// Valid for lookups (a copy being built is not yet).
    valid: bool,
}

impl StateIndex {
    fn info(&self) -> *mut pg_sys::IndexInfo {
        if self.info.get().is_null() {
            // SAFETY: `relation` was opened by StateTable::open and stays open until the table
            // drops, and BuildIndexInfo needs only an open index.
            self.info.set(unsafe { pg_sys::BuildIndexInfo(self.relation) });
        }
        self.info.get()
    }
}

/// `rate_limiter.state` and its indexes, open for one call, with the snapshot the call reads
/// with. Closed on drop, on error paths too.
/// `rate_limiter.state` locked for a consuming call (`StateTable::lock_for_call`): its OID,
/// as locked.
#[derive(Clone, Copy)]
pub struct CallLock(pg_sys::Oid);

pub struct StateTable {
    heap: pg_sys::Relation,
    /// Where lookups go: the valid unique index.
    index: pg_sys::Relation,
    /// Every index open for this call: the ones a new row version must be entered in when
    /// open for writing, the lookup index alone when open for reading.
    indexes: Vec<StateIndex>,
    snapshot: pg_sys::Snapshot,
    /// Reads keep to the transaction's snapshot (REPEATABLE READ, SERIALIZABLE): a row
    /// changed after it is a serialization failure rather than followed to its newest version.
    snapshot_isolation: bool,
    tuple_slot: *mut pg_sys::TupleTableSlot,
}

impl StateTable {
    /// Open for reading, or for writing (which a read-only transaction refuses, with
    /// `command` named in the error).
    pub fn open(write: Option<&std::ffi::CStr>) -> StateTable {
        Self::opened(write, xact_snapshot_isolation())
    }

    /// Open for writing with the newest committed rows, whatever the isolation level: for the
    /// fold of a hot limit's log, which moves committed debits into base rows without changing
    /// what they add up to, so the caller's snapshot has no say in it (docs/hot-limits.md).
    pub fn open_newest(command: &std::ffi::CStr) -> StateTable {
        Self::opened(Some(command), false)
    }

    /// Open for a consuming call whose limit is not known yet: locked as for writing, so that
    /// a change of a limit waits for it, but writable only once `prepare_writes` says so (a
    /// memory limit's call writes nothing, in a read-only transaction or on a standby too).
    /// A parallel worker is refused either way: its calls would end with the worker, not
    /// with the transaction they belong to.
    pub fn open_for_call(command: &std::ffi::CStr) -> StateTable {
        Self::open_after_call_lock(Self::lock_for_call(command))
    }

    /// `open_for_call` once `lock_for_call` took the lock in this call: the table it locked,
    /// opened without locking it again, its shape checked.
    pub fn open_after_call_lock(lock: CallLock) -> StateTable {
        // The OID locked, whatever the cache found since; an assert-enabled server checks
        // that the lock is held.
        let heap = super::open_table(lock.0, pg_sys::NoLock as pg_sys::LOCKMODE, "rate_limiter.state");
        Self::checked(heap, xact_snapshot_isolation())
    }

    /// What a consuming call does first, locked or not: a parallel worker is refused, and
    /// pending invalidations (of cached configs among them) are taken in.
    pub fn ready_for_call(command: &std::ffi::CStr) {
        super::prevent_in_parallel_mode(command);
        // SAFETY: taking in invalidations is allowed anywhere in a transaction.
        unsafe { pg_sys::AcceptInvalidationMessages() };
    }

    /// As `open_for_call`, the lock alone, to the end of the transaction (a change of a limit
    /// waits for it, `shmem::gate::hold_calls_off`), without opening it; `open_after_call_lock`
    /// opens the table it locked. Pending invalidations are taken in first, as for any open.
    pub fn lock_for_call(command: &std::ffi::CStr) -> CallLock {
        Self::ready_for_call(command);
        Self::lock_when_ready()
    }

    /// `lock_for_call` once `ready_for_call` ran in this call.
    pub fn lock_when_ready() -> CallLock {
        // The generation first: a look-up of the cache's OIDs can itself take in the drop of
        // the table it then names.
        let generation = cache::generation();
        let state = cache::relations().state;
        // SAFETY: inside a transaction; a lock on an OID that names nothing (a DROP
        // EXTENSION committed while this call waited) is harmless, and is refused below.
        unsafe { pg_sys::LockRelationOid(state, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) };
        // A drop of the table that committed meanwhile (or a reset of every cache) moved the
        // caches' generation, by the time the lock was newly taken. Unmoved, the table is the
        // one the cache found.
        if cache::generation() != generation {
            // SAFETY: a syscache probe by OID; the lock above keeps the answer true.
            let exists =
                unsafe { pg_sys::SearchSysCacheExists(pg_sys::SysCacheIdentifier::RELOID as i32, state.into(), 0.into(), 0.into(), 0.into()) };
            if !exists {
                Error::RelationGone("rate_limiter.state".into()).raise()
            }
        }
        CallLock(state)
    }

    fn opened(write: Option<&std::ffi::CStr>, snapshot_isolation: bool) -> StateTable {
        let lockmode = if write.is_some() { pg_sys::RowExclusiveLock } else { pg_sys::AccessShareLock };
        let mut table = Self::locked(lockmode as pg_sys::LOCKMODE, snapshot_isolation);
        table.begin_reading();
        match write {
            Some(command) => table.prepare_writes(command),
            None => {
                // Taking the table's lock took in invalidations: the index OID is the current one.
                // SAFETY: a valid index of the table, locked as the table is.
                table.index = unsafe { pg_sys::index_open(cache::relations().state_key, lockmode as pg_sys::LOCKMODE) };
                let info = std::cell::Cell::new(null_mut());
                table.indexes.push(StateIndex { relation: table.index, info, valid: true });
                // SAFETY: the index is open; its probes read columns 1 to 3 by position.
                if !unsafe { is_key_copy(table.index) && shape::index_usable(table.index) } {
                    let detail = "its unique index is not the one the extension made".to_owned();
                    Error::ShapeChanged { relation: "rate_limiter.state".into(), detail }.raise()
                }
            }
        }
        table
    }

    /// The table locked in `lockmode`, its shape checked; no snapshot (`begin_reading`), no index.
    fn locked(lockmode: pg_sys::LOCKMODE, snapshot_isolation: bool) -> StateTable {
        // SAFETY: taking in invalidations is allowed anywhere in a transaction.
        unsafe { pg_sys::AcceptInvalidationMessages() };
        // The OID is the extension's table, looked up after the invalidations above; the lock
        // is held to the end of the transaction.
        let heap = super::open_table(cache::relations().state, lockmode, "rate_limiter.state");
        Self::checked(heap, snapshot_isolation)
    }

    /// The open and locked `heap`, its shape checked.
    fn checked(heap: pg_sys::Relation, snapshot_isolation: bool) -> StateTable {
        let table = StateTable {
            heap,
            index: null_mut(),
            indexes: Vec::new(),
            snapshot: null_mut(),
            snapshot_isolation,
            tuple_slot: null_mut(),
        };
        // SAFETY: `heap` is open and locked, so its descriptor is current.
        unsafe { check_shape(heap) };
        table
    }

    /// The call's snapshot and a slot to read rows into, once: a call opened for its lock alone
    /// (`open_for_call`, before it knows whether its limit writes) takes neither until then.
    fn begin_reading(&mut self) {
        if !self.snapshot.is_null() {
            return;
        }
        // SAFETY: as SPI does for each statement of a VOLATILE function: a fresh snapshot at
        // READ COMMITTED (the transaction's otherwise, unless the newest rows were asked
        // for), which also sees this transaction's earlier commands. Popped on drop.
        unsafe {
            let snapshot = if self.snapshot_isolation || !xact_snapshot_isolation() {
                pg_sys::GetTransactionSnapshot()
            } else {
                pg_sys::GetLatestSnapshot()
            };
            pg_sys::PushActiveSnapshot(snapshot);
            pg_sys::UpdateActiveSnapshotCommandId();
            self.snapshot = pg_sys::GetActiveSnapshot();
            self.tuple_slot = pg_sys::table_slot_create(self.heap, null_mut());
        }
    }

    /// Ready to write rows, opened by `open_for_call` or for writing (which a read-only
    /// transaction refuses, with `command` named in the error). Once per table.
    pub fn prepare_writes(&mut self, command: &std::ffi::CStr) {
        if !self.indexes.is_empty() {
            return;
        }
        prevent_writes_unless_allowed(command);
        self.begin_reading();
        let heap = self.heap;
        // As the executor does before an UPDATE: refuse if a publication would get
        // updates it cannot identify on the subscriber.
        // SAFETY: `heap` is open; this only reads its publication info or raises.
        unsafe { pg_sys::CheckCmdReplicaIdentity(heap, pg_sys::CmdType::CMD_UPDATE) };
        // Writes here fire no triggers: refuse rather than skip one silently.
        // SAFETY: `heap` is open; its trigger descriptor is null or valid.
        if unsafe { !(*heap).trigdesc.is_null() && (*(*heap).trigdesc).numtriggers > 0 } {
            Error::StateTableChanged.raise()
        }
        self.open_indexes(pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
    }

    /// Open every index of the table, which must each be the unique index or a copy of it:
    /// another index would need expressions or columns this path does not maintain.
    fn open_indexes(&mut self, lockmode: pg_sys::LOCKMODE) {
        // SAFETY: `heap` is open; the list is a copy we free.
        let list = unsafe { pg_sys::RelationGetIndexList(self.heap) };
        let oids: Vec<pg_sys::Oid> = if list.is_null() {
            Vec::new()
        } else {
            // SAFETY: an OID list of `length` elements.
            unsafe { (0..(*list).length).map(|i| (*(*list).elements.add(i as usize)).oid_value).collect() }
        };
        // SAFETY: freeing the copy made above.
        unsafe { pg_sys::list_free(list) };
        for oid in oids {
            // SAFETY: an index of the locked table, opened with the table's lock mode.
            let relation = unsafe { pg_sys::index_open(oid, lockmode) };
            // SAFETY: an open index relation has its pg_index row.
            let form = unsafe { &*(*relation).rd_index };
            let info = std::cell::Cell::new(null_mut());
            // Pushed before checking, so that drop closes it on the error path too.
            self.indexes.push(StateIndex { relation, info, valid: form.indisvalid && form.indislive });
            // SAFETY: `relation` is open.
            if !unsafe { is_key_copy(relation) } {
                Error::StateTableChanged.raise()
            }
            if !form.indisready {
                // Being dropped (REINDEX CONCURRENTLY's last step): no new entries.
                self.indexes.pop();
                // SAFETY: opened above and just popped from `indexes`, so drop will not close
                // it again.
                unsafe { pg_sys::index_close(relation, lockmode) };
            }
        }
        self.index = self
            .indexes
            .iter()
            .find(|i| i.valid)
            .map(|i| i.relation)
            .unwrap_or_else(|| Error::StateTableChanged.raise());
    }

    /// The row of `slot` as of the call's snapshot.
    pub fn read(&self, slot: Slot<'_>) -> Option<Row> {
        self.find(slot, self.snapshot)
    }

    /// The row of `slot` as `latest` sees it, whatever the call's snapshot.
    pub fn read_at(&self, slot: Slot<'_>, latest: &super::Latest) -> Option<Row> {
        self.find(slot, latest.snapshot())
    }

    fn find(&self, slot: Slot<'_>, snapshot: pg_sys::Snapshot) -> Option<Row> {
        // SAFETY: the relations and slot are open for this call; `snapshot` outlives the scan.
        unsafe {
            let mut keys = slot_keys(self.index, slot);
            probe(self.heap, self.index, snapshot, &mut keys, self.tuple_slot).then(|| self.slot_row())
        }
    }

    /// The row in `tuple_slot`.
    ///
    /// # Safety
    /// `tuple_slot` holds a tuple of the state table.
    unsafe fn slot_row(&self) -> Row {
        let attr = |n: i16| {
            let mut isnull = false;
            // SAFETY: the slot holds a tuple with these columns (shape checked at open).
            let d = unsafe { pg_sys::slot_getattr(self.tuple_slot, n.into(), &mut isnull) };
            (!isnull).then_some(d)
        };
        let required = "rate_limiter.state.value and ts are NOT NULL";
        let value = f64::from_bits(attr(VALUE).expect(required).value() as u64);
        let ts = clock::pg_us_to_ms(attr(TS).expect(required).value() as i64);
        let counts = match attr(COUNTS) {
            None => Counts::NONE,
            // SAFETY: a float8[] datum of the tuple in the slot (the column's type checked at
            // open), alive while the slot holds the tuple.
            Some(d) => unsafe { counts_of(d) }.unwrap_or_else(|| Error::StateTableChanged.raise()),
        };
        let granted_at = attr(GRANTED_AT).map(|d| clock::pg_us_to_ms(d.value() as i64));
        // SAFETY: as above; the slot's tid is that of the tuple in it.
        Row { state: State { value, ts, counts, granted_at }, tid: unsafe { (*self.tuple_slot).tts_tid } }
    }

    /// Later reads of this call must see what it just wrote.
    fn next_command(&self) {
        // SAFETY: our snapshot is the active one (pushed at open, popped on drop), so it is
        // the one whose command id is advanced.
        unsafe {
            pg_sys::CommandCounterIncrement();
            pg_sys::UpdateActiveSnapshotCommandId();
        }
    }

    /// Write `state`, to expire at `expires`, over `row`. Without `wait`, gives up when
    /// another transaction holds it.
    pub fn update(&self, row: &Row, slot: Slot<'_>, state: &State, expires: f64, wait: bool) -> Written {
        if !wait {
            // heap_update may not be asked not to wait for a row another transaction holds
            // (an assertion of the server's says so): the row is locked without waiting
            // first, as UPDATE after SELECT ... FOR NO KEY UPDATE SKIP LOCKED does, and then
            // updated, which waits for nobody once this transaction holds it.
            match self.lock(row, false) {
                Locked::Busy => return Written::Busy,
                Locked::Row(newest) if same_tid(&newest.tid, &row.tid) => {}
                // Changed meanwhile: decided again on the newest version.
                Locked::Row(_) | Locked::Gone => return Written::Moved,
            }
        }
        let tuple = self.form(slot, state, expires);
        let mut tid = row.tid;
        // SAFETY: plain-old-data out parameter.
        let mut failure: pg_sys::TM_FailureData = unsafe { std::mem::zeroed() };
        // SAFETY: `tuple` was formed from this table's descriptor; `tid` is a version this call
        // read or locked, so pruning cannot have removed it; only consuming calls update, and
        // they open the table for writing (RowExclusiveLock, every index open).
        let (result, entries) = unsafe {
            let cid = pg_sys::GetCurrentCommandId(true);
            server::heap_update(self.heap, &mut tid, tuple, cid, &mut failure)
        };
        match result {
            TM_Result::TM_Ok => {
                // The new entries skip the uniqueness check: the slot is unchanged and this
                // transaction holds its only live version.
                let check = pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO;
                match entries {
                    NewIndexEntries::None => {}
                    NewIndexEntries::All => {
                        self.index_insert(slot, tuple, check, true, false);
                    }
                    NewIndexEntries::SummarizingOnly => {
                        self.index_insert(slot, tuple, check, true, true);
                    }
                }
                self.next_command();
                Written::Done
            }
            TM_Result::TM_Updated | TM_Result::TM_Deleted if self.snapshot_isolation => {
                Error::SerializationFailure.raise()
            }
            TM_Result::TM_Updated | TM_Result::TM_Deleted => Written::Moved,
            other => error!("rate_limiter: unexpected heap_update result {other}"),
        }
    }

    /// Write `state` over `row`, which this transaction holds locked.
    pub fn write_locked(&self, row: &Row, slot: Slot<'_>, state: &State, expires: f64) {
        match self.update(row, slot, state, expires, true) {
            Written::Done => {}
            _ => unreachable!("a row this transaction holds locked cannot change"),
        }
    }

    /// Lock the newest version of `row` (`FOR NO KEY UPDATE`). Without `wait`, gives up
    /// when another transaction holds it.
    pub fn lock(&self, row: &Row, wait: bool) -> Locked {
        let mut tid = row.tid;
        // SAFETY: plain-old-data out parameter.
        let mut failure: pg_sys::TM_FailureData = unsafe { std::mem::zeroed() };
        let follow = if self.snapshot_isolation { 0 } else { pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION };
        let policy = if wait { pg_sys::LockWaitPolicy::LockWaitBlock } else { pg_sys::LockWaitPolicy::LockWaitSkip };
        // SAFETY: relation, snapshot and slot are open for this call; `tid` is a row of it.
        let result = unsafe {
            pg_sys::table_tuple_lock(
                self.heap,
                &mut tid,
                self.snapshot,
                self.tuple_slot,
                pg_sys::GetCurrentCommandId(true),
                pg_sys::LockTupleMode::LockTupleNoKeyExclusive,
                policy,
                follow as u8,
                &mut failure,
            )
        };
        match result {
            // SAFETY: the lock put the locked version in the slot.
            TM_Result::TM_Ok => Locked::Row(unsafe { self.slot_row() }),
            TM_Result::TM_WouldBlock => Locked::Busy,
            TM_Result::TM_Updated | TM_Result::TM_Deleted if self.snapshot_isolation => {
                Error::SerializationFailure.raise()
            }
            TM_Result::TM_Deleted => Locked::Gone,
            other => error!("rate_limiter: unexpected table_tuple_lock result {other}"),
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
    pub fn create(&self, slot: Slot<'_>, state: &State, expires: f64, wait: bool) -> Created {
        if let Some(row) = self.insert_if_unique(slot, state, expires) {
            return Created::Done(row);
        }
        let mut hasher = DefaultHasher::new();
        (slot.stored_name(), slot.key, slot.stored_shard()).hash(&mut hasher);
        let hash = hasher.finish();
        let tag = pg_sys::LOCKTAG {
            // SAFETY: MyDatabaseId is written only while the backend connects, before any SQL
            // runs, and backends are single-threaded, so this read cannot race a write.
            locktag_field1: unsafe { pg_sys::MyDatabaseId }.into(),
            locktag_field2: (hash >> 32) as u32,
            locktag_field3: hash as u32,
            locktag_field4: CREATE_LOCK_SPACE,
            locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
            locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
        };
        let mode = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;
        loop {
            // A creator that keeps losing races still answers a cancel or statement_timeout.
            check_for_interrupts!();
            // SAFETY: a session-independent advisory lock, released below on every path
            // that returns normally (an error releases it with the transaction).
            unsafe { pg_sys::LockAcquire(&tag, mode, false, false) };
            // SAFETY: a dirty snapshot is plain data that HeapTupleSatisfiesDirty fills in.
            let mut dirty: pg_sys::SnapshotData = unsafe { std::mem::zeroed() };
            dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
            let found = self.find(slot, &mut dirty);
            let created = if found.is_none() { self.insert_if_unique(slot, state, expires) } else { None };
            // SAFETY: the lock taken above.
            unsafe { pg_sys::LockRelease(&tag, mode, false) };
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
                // SAFETY: waits on transaction ids the dirty snapshot reported; both return
                // once that transaction (or its speculative insertion) is over.
                unsafe {
                    if dirty.speculativeToken != 0 {
                        // Mid-insertion: it is confirmed or taken back in a moment.
                        pg_sys::SpeculativeInsertionWait(inserter, dirty.speculativeToken);
                    } else {
                        let running = if inserter != pg_sys::InvalidTransactionId { inserter } else { updater };
                        pg_sys::XactLockTableWait(running, self.heap, &mut tid, pg_sys::XLTW_Oper::XLTW_InsertIndex);
                    }
                }
                continue; // look again
            }
            // Committed, or this transaction's own: at snapshot isolation only a row our
            // snapshot sees may be used; one committed after it is a conflict.
            if self.snapshot_isolation && self.read(slot).is_none() {
                Error::SerializationFailure.raise()
            }
            return Created::Exists(row);
        }
    }

    /// Insert the row speculatively; `None` (and the row taken back) if another live or
    /// uncommitted row of the slot might exist.
    fn insert_if_unique(&self, slot: Slot<'_>, state: &State, expires: f64) -> Option<Row> {
        let tuple = self.form(slot, state, expires);
        // SAFETY: the speculative insertion protocol of ExecInsert: take the token, insert
        // with it, enter the index entries, then confirm or take back, and release.
        let unique = unsafe {
            let xid = pg_sys::GetCurrentTransactionId();
            let token = pg_sys::SpeculativeInsertionLockAcquire(xid);
            // HeapTupleHeaderSetSpeculativeToken: the token waits in t_ctid until confirmed.
            let ctid = &mut (*(*tuple).t_data).t_ctid;
            ctid.ip_blkid.bi_hi = (token >> 16) as u16;
            ctid.ip_blkid.bi_lo = token as u16;
            ctid.ip_posid = pg_sys::SpecTokenOffsetNumber as u16;
            let cid = pg_sys::GetCurrentCommandId(true);
            pg_sys::heap_insert(self.heap, tuple, cid, pg_sys::HEAP_INSERT_SPECULATIVE as i32, null_mut());
            let unique = self.index_insert(slot, tuple, pg_sys::IndexUniqueCheck::UNIQUE_CHECK_PARTIAL, false, false);
            if unique {
                pg_sys::heap_finish_speculative(self.heap, &mut (*tuple).t_self);
            } else {
                pg_sys::heap_abort_speculative(self.heap, &mut (*tuple).t_self);
            }
            pg_sys::SpeculativeInsertionLockRelease(xid);
            unique
        };
        self.next_command();
        // SAFETY: heap_insert set the new row's tid.
        unique.then(|| Row { state: state.clone(), tid: unsafe { (*tuple).t_self } })
    }

    fn form(&self, slot: Slot<'_>, state: &State, expires: f64) -> pg_sys::HeapTuple {
        let mut values = [
            text(&slot.stored_name()),
            slot.key.map(text).unwrap_or(Datum::from(0)),
            Datum::from(slot.stored_shard()),
            state.value.into_datum().expect("float8"),
            instant(state.ts, "time"),
            // An expiry past the last instant PostgreSQL can store is never.
            clock::ms_to_pg_us(expires).map_or(Datum::from(i64::MAX), Datum::from),
            // NULL when the state keeps no counts (a row read as written before 0.8.0).
            match state.counts.as_slice() {
                [] => Datum::from(0),
                counts => counts_datum(counts),
            },
            state.granted_at.map_or(Datum::from(0), |at| instant(at, "granted_at")),
        ];
        let no_counts = state.counts.as_slice().is_empty();
        let mut nulls = [false, slot.key.is_none(), false, false, false, false, no_counts, state.granted_at.is_none()];
        // SAFETY: `values` and `nulls` match the descriptor's columns (shape checked at open).
        unsafe { pg_sys::heap_form_tuple((*self.heap).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr()) }
    }

    /// Enter a new row version of `slot` in every index (only the summarizing ones with
    /// `only_summarizing`); false if an index found another live or uncommitted row of the
    /// slot (only with `UNIQUE_CHECK_PARTIAL`).
    fn index_insert(
        &self,
        slot: Slot<'_>,
        tuple: pg_sys::HeapTuple,
        check: pg_sys::IndexUniqueCheck::Type,
        unchanged: bool,
        only_summarizing: bool,
    ) -> bool {
        // Every index has the columns (key, name, shard): see `is_key_copy`.
        let mut values = [slot.key.map(text).unwrap_or(Datum::from(0)), text(&slot.stored_name()), Datum::from(slot.stored_shard())];
        let mut nulls = [slot.key.is_none(), false, false];
        let mut unique = true;
        // SAFETY: each index is open for this call.
        let wanted = |index: &&StateIndex| !only_summarizing || unsafe { server::is_summarizing(index.relation) };
        for index in self.indexes.iter().filter(wanted) {
            // SAFETY: `tuple` is a stored version of this table; each index and its info are
            // open for this call; the arrays match the index's three columns.
            unique &= unsafe {
                pg_sys::index_insert(
                    index.relation,
                    values.as_mut_ptr(),
                    nulls.as_mut_ptr(),
                    &mut (*tuple).t_self,
                    self.heap,
                    check,
                    unchanged,
                    index.info(),
                )
            };
        }
        unique
    }
}

impl Drop for StateTable {
    fn drop(&mut self) {
        if super::unwinding() {
            return;
        }
        // SAFETY: each was opened by `open` and is closed once; on an error path the
        // snapshot is popped only if it is still on top (else the abort pops it).
        unsafe {
            if !self.tuple_slot.is_null() {
                pg_sys::ExecDropSingleTupleTableSlot(self.tuple_slot);
            }
            if !self.snapshot.is_null() && pg_sys::ActiveSnapshotSet() && pg_sys::GetActiveSnapshot() == self.snapshot {
                pg_sys::PopActiveSnapshot();
            }
            for index in &self.indexes {
                if !index.info.get().is_null() {
                    server::index_insert_cleanup(index.relation, index.info.get());
                }
                pg_sys::index_close(index.relation, pg_sys::NoLock as _);
            }
            pg_sys::table_close(self.heap, pg_sys::NoLock as _);
        }
    }
}

fn same_tid(a: &pg_sys::ItemPointerData, b: &pg_sys::ItemPointerData) -> bool {
    (a.ip_blkid.bi_hi, a.ip_blkid.bi_lo, a.ip_posid) == (b.ip_blkid.bi_hi, b.ip_blkid.bi_lo, b.ip_posid)
}

/// Refuse to read or write rows of a shape other than the one `form` and `slot_row` use:
/// 55000 after an ALTER TABLE. (A table older than the library is caught before, with its
/// own hint, when `cache` looks the relations up.)
///
/// # Safety
/// `heap` is open and locked.
unsafe fn check_shape(heap: pg_sys::Relation) {
    // SAFETY: an open relation's descriptor and pg_class row.
    unsafe {
        shape::require((*heap).rd_att, "rate_limiter.state", &shape::STATE, shape::Columns::Exactly);
        shape::require_plain_heap(heap, "rate_limiter.state");
    }
}

/// Whether an index is the unique index on (key, name, shard) or an exact copy of it, the
/// only kind a write here keeps up to date: read from its pg_index row, without building
/// anything.
///
/// # Safety
/// `index` is open.
unsafe fn is_key_copy(index: pg_sys::Relation) -> bool {
    // SAFETY: an open index has its pg_index row; `index_has` reads it as it promises.
    unsafe {
        let form = &*(*index).rd_index;
        form.indimmediate && form.indnullsnotdistinct && shape::index_has(index, true, &INDEX_COLUMNS)
    }
}

/// Equality keys on (key, name, shard); a NULL key matches the NULL key (the index is
/// NULLS NOT DISTINCT).
///
/// # Safety
/// `index` is the open unique index of the state table.
unsafe fn slot_keys(index: pg_sys::Relation, slot: Slot<'_>) -> [pg_sys::ScanKeyData; 3] {
    // SAFETY: the caller promises the state table's open unique index, (key text, name text,
    // shard int2), which is what text_key and equal_key require of columns 1 to 3.
    unsafe {
        [
            text_key(index, INDEX_KEY, slot.key),
            text_key(index, INDEX_NAME, Some(&slot.stored_name())),
            equal_key(index, INDEX_SHARD, pg_sys::F_INT2EQ, Datum::from(slot.stored_shard())),
        ]
    }
}

/// The counts of a `float8[]` datum: one dimension, no NULL, at most `MAX_COUNTS` (an empty
/// array has none); None for any other. Read in place: a call reads them on every row.
///
/// # Safety
/// `d` is a valid `float8[]` datum, alive for the call.
unsafe fn counts_of(d: Datum) -> Option<Counts> {
    // SAFETY: a varlena datum (the caller's promise); detoasting gives an ArrayType with a
    // 4-byte header, the datum itself or a copy in the current memory context.
    let array = unsafe { pg_sys::pg_detoast_datum(d.cast_mut_ptr()) }.cast::<pg_sys::ArrayType>();
    // SAFETY: an ArrayType's header, then (ndim) dimensions and lower bounds, then its data at
    // ARR_DATA_OFFSET: with no NULL bitmap (dataoffset 0), MAXALIGN of the header and those.
    unsafe {
        let header = &*array;
        if header.ndim == 0 {
            return Some(Counts::NONE);
        }
        if header.ndim != 1 || header.dataoffset != 0 || header.elemtype != pg_sys::FLOAT8OID {
            return None;
        }
        let len = usize::try_from(*array.cast::<u8>().add(size_of::<pg_sys::ArrayType>()).cast::<i32>()).ok()?;
        if len > crate::bucket::MAX_COUNTS {
            return None;
        }
        let offset = (size_of::<pg_sys::ArrayType>() + 2 * size_of::<i32>()).next_multiple_of(pg_sys::MAXIMUM_ALIGNOF as usize);
        let data = std::slice::from_raw_parts(array.cast::<u8>().add(offset).cast::<f64>(), len);
        Counts::new(data)
    }
}

/// `counts` as a `float8[]` datum, in the current memory context.
fn counts_datum(counts: &[f64]) -> Datum {
    let mut elements: Vec<Datum> = counts.iter().map(|c| Datum::from(c.to_bits())).collect();
    // SAFETY: `elements` holds `counts.len()` float8 datums by value (FLOAT8PASSBYVAL on the
    // 64-bit platforms pgrx builds for), 8 bytes each, double-aligned; construct_array copies
    // them into a new array of the current memory context.
    let array = unsafe {
        pg_sys::construct_array(elements.as_mut_ptr(), counts.len() as i32, pg_sys::FLOAT8OID, 8, true, pg_sys::TYPALIGN_DOUBLE as std::ffi::c_char)
    };
    Datum::from(array)
}

