//! The server calls whose signatures or duties differ between the supported PostgreSQL
//! majors (15, 16, 17, 18), each difference with the version that made it. Nothing else in the
//! crate has a `cfg` on a PostgreSQL version.

use std::ptr::null_mut;

use pgrx::pg_sys;

/// Which indexes need an entry for the row version an update wrote.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NewIndexEntries {
    /// A HOT update: the indexes still find the row through the old version's entry.
    None,
    /// Every index (the new version is on another page, or an indexed column changed).
    All,
    /// A HOT update that changed a column of a summarizing index (BRIN): those need one.
    /// 15 never makes one (a changed indexed column of any kind prevents HOT there), and the
    /// state table has no such index today (`StateTable::open` refuses any index but copies
    /// of its unique key); handled as the executor does, so that allowing one later is safe.
    #[cfg_attr(feature = "pg15", allow(dead_code))]
    SummarizingOnly,
}

/// `heap_update` of `tuple` over the version at `tid`, as `simple_heap_update` does but
/// returning the result instead of raising it; also says which indexes need entries. It
/// waits for a transaction that holds the row: heap_update's "no wait" is for a row the
/// caller already holds (asserted), so a caller that must not wait locks the row first.
///
/// # Safety
/// `heap` is open for writing; `tuple` was formed from its descriptor; `tid` is a version of
/// it this transaction read or locked.
pub unsafe fn heap_update(
    heap: pg_sys::Relation,
    tid: &mut pg_sys::ItemPointerData,
    tuple: pg_sys::HeapTuple,
    cid: pg_sys::CommandId,
    failure: &mut pg_sys::TM_FailureData,
) -> (pg_sys::TM_Result::Type, NewIndexEntries) {
    let mut lockmode = pg_sys::LockTupleMode::LockTupleNoKeyExclusive;
    // 15: heap_update says nothing about indexes; the executor looks at the new version's
    // heap-only flag, which heap_update sets for a HOT update.
    #[cfg(feature = "pg15")]
    // SAFETY: the caller's contract; the flag is read from the header heap_update filled in.
    unsafe {
        let result = pg_sys::heap_update(heap, tid, tuple, cid, null_mut(), true, failure, &mut lockmode);
        let heap_only = (*(*tuple).t_data).t_infomask2 & pg_sys::HEAP_ONLY_TUPLE as u16 != 0;
        (result, if heap_only { NewIndexEntries::None } else { NewIndexEntries::All })
    }
    // 16: heap_update reports it, and a HOT update may still need summarizing-index entries.
    #[cfg(any(feature = "pg16", feature = "pg17", feature = "pg18"))]
    // SAFETY: the caller's contract; `update_indexes` is a plain out parameter.
    unsafe {
        let mut update_indexes = pg_sys::TU_UpdateIndexes::TU_None;
        let result = pg_sys::heap_update(heap, tid, tuple, cid, null_mut(), true, failure, &mut lockmode, &mut update_indexes);
        let entries = match update_indexes {
            pg_sys::TU_UpdateIndexes::TU_All => NewIndexEntries::All,
            pg_sys::TU_UpdateIndexes::TU_Summarizing => NewIndexEntries::SummarizingOnly,
            _ => NewIndexEntries::None,
        };
        (result, entries)
    }
}

/// Whether `index` is summarizing (BRIN): it needs an entry even for a HOT update that
/// changed one of its columns.
///
/// # Safety
/// `index` is an open index.
pub unsafe fn is_summarizing(index: pg_sys::Relation) -> bool {
    // 16: index access methods declare `amsummarizing`; before, none was treated so.
    #[cfg(feature = "pg15")]
    {
        let _ = index;
        false
    }
    #[cfg(any(feature = "pg16", feature = "pg17", feature = "pg18"))]
    // SAFETY: an open index has its access method's routine.
    unsafe {
        (*(*index).rd_indam).amsummarizing
    }
}

/// What the executor does when it closes an index it inserted into.
///
/// # Safety
/// `index` is open; `info` is the `IndexInfo` the inserts used.
pub unsafe fn index_insert_cleanup(index: pg_sys::Relation, info: *mut pg_sys::IndexInfo) {
    // 17: index_insert_cleanup lets an access method free what its inserts cached (BRIN).
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: the caller's contract.
    unsafe {
        pg_sys::index_insert_cleanup(index, info)
    }
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    let _ = (index, info);
}

/// `index_beginscan` with no ORDER BY keys and no instrumentation.
///
/// # Safety
/// `index` is an open index of the open `heap`; `snapshot` outlives the scan.
pub unsafe fn index_beginscan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
) -> pg_sys::IndexScanDesc {
    // 18: an `IndexScanInstrumentation *` comes before the key counts.
    #[cfg(feature = "pg18")]
    // SAFETY: the caller's contract; a NULL instrumentation is allowed.
    unsafe {
        pg_sys::index_beginscan(heap, index, snapshot, null_mut(), nkeys, 0)
    }
    #[cfg(not(feature = "pg18"))]
    // SAFETY: the caller's contract.
    unsafe {
        pg_sys::index_beginscan(heap, index, snapshot, nkeys, 0)
    }
}

/// Column `i` (from 0) of a row descriptor.
///
/// # Safety
/// `desc` is a valid descriptor with more than `i` columns.
pub unsafe fn attribute<'a>(desc: pg_sys::TupleDesc, i: usize) -> &'a pg_sys::FormData_pg_attribute {
    // 18: the attributes follow a compact array, so only TupleDescAttr() finds them.
    #[cfg(feature = "pg18")]
    // SAFETY: the caller's contract.
    unsafe {
        &*pg_sys::TupleDescAttr(desc, i as _)
    }
    #[cfg(not(feature = "pg18"))]
    // SAFETY: the caller's contract: `attrs` holds `natts` attributes.
    unsafe {
        &*(*desc).attrs.as_ptr().add(i)
    }
}

/// SIGTERM handled as a backend handles it (`die`: the next interrupt check ends the
/// process), then signals unblocked: for a background worker that must stop when terminated
/// even in the middle of a vacuum's cost delay or a lock wait. 18 renamed the backend's
/// `pqsignal` to `pqsignal_be`.
///
/// # Safety
/// Only at the start of a background worker, before it connects.
pub unsafe fn die_on_sigterm() {
    // The server's own `die`, as a handler: pgrx's binding of it is a Rust function.
    extern "C-unwind" {
        #[link_name = "die"]
        fn server_die(signal: std::ffi::c_int);
    }
    // SAFETY: the caller's contract; `die` is PostgreSQL's own handler for this signal.
    unsafe {
        #[cfg(not(feature = "pg18"))]
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, Some(server_die));
        #[cfg(feature = "pg18")]
        pg_sys::pqsignal_be(pg_sys::SIGTERM as i32, Some(server_die));
        pg_sys::BackgroundWorkerUnblockSignals();
    }
}

/// This backend's transaction, as another backend can wait for it: its proc number (backend
/// id before 17) and local transaction id.
pub fn my_transaction() -> (i32, u32) {
    // SAFETY: MyProc is this backend's PGPROC, set before any SQL runs; only this backend
    // writes its transaction ids.
    unsafe {
        let proc = &*pg_sys::MyProc;
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        return (proc.vxid.procNumber, proc.vxid.lxid);
        #[cfg(any(feature = "pg15", feature = "pg16"))]
        return (proc.backendId, proc.lxid);
    }
}

/// Wait until the transaction `my_transaction` gave in another backend has ended (at once if
/// it has), through the lock every transaction holds on itself: the deadlock detector sees
/// the wait, and a cancel or statement_timeout ends it.
pub fn wait_for_transaction(transaction: (i32, u32)) {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    let vxid = pg_sys::VirtualTransactionId { procNumber: transaction.0, localTransactionId: transaction.1 };
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    let vxid = pg_sys::VirtualTransactionId { backendId: transaction.0, localTransactionId: transaction.1 };
    // SAFETY: a plain value; VirtualXactLock waits or returns, and raises on a deadlock or an
    // interrupt, inside the caller's transaction.
    unsafe { pg_sys::VirtualXactLock(vxid, true) };
}
