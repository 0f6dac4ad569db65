//! Index probes shared by the writers and the lookups: equality scan keys and one probe.

use std::ptr::null_mut;

use pgrx::pg_sys::{self, Datum};

use super::{server, text};

/// Look `keys` up in `index` as of `snapshot`; true when a visible row was found, which is
/// then in `tuple_slot`. Each index is unique, so the first match is the only one.
///
/// # Safety
/// `index` is an open index of the open `heap`; `tuple_slot` is a slot of `heap`; `snapshot`
/// is valid for the scan.
pub(super) unsafe fn probe(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    keys: &mut [pg_sys::ScanKeyData],
    tuple_slot: *mut pg_sys::TupleTableSlot,
) -> bool {
    // SAFETY: the caller's promises; the scan is ended before returning.
    unsafe {
        let scan = server::index_beginscan(heap, index, snapshot, keys.len() as _);
        pg_sys::index_rescan(scan, keys.as_mut_ptr(), keys.len() as _, null_mut(), 0);
        let found = pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, tuple_slot);
        pg_sys::index_endscan(scan);
        found
    }
}

/// Each visible row matching `keys` in `index` as of `snapshot`, in `tuple_slot` while
/// `each` runs; the scan stops when `each` answers false.
///
/// # Safety
/// As `probe`'s.
pub(super) unsafe fn scan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    keys: &mut [pg_sys::ScanKeyData],
    tuple_slot: *mut pg_sys::TupleTableSlot,
    mut each: impl FnMut() -> bool,
) {
    /// The scan, ended on drop: also when `each` raises, before the caller closes the
    /// relations and the slot it reads.
    struct Ended(pg_sys::IndexScanDesc);
    impl Drop for Ended {
        fn drop(&mut self) {
            if super::unwinding() {
                return;
            }
            // SAFETY: a scan begun below and ended only here.
            unsafe { pg_sys::index_endscan(self.0) }
        }
    }
    // SAFETY: the caller's promises; the scan is ended when `scan` drops.
    unsafe {
        let scan = Ended(server::index_beginscan(heap, index, snapshot, keys.len() as _));
        pg_sys::index_rescan(scan.0, keys.as_mut_ptr(), keys.len() as _, null_mut(), 0);
        while pg_sys::index_getnext_slot(scan.0, pg_sys::ScanDirection::ForwardScanDirection, tuple_slot) {
            pgrx::check_for_interrupts!();
            if !each() {
                break;
            }
        }
    }
}

/// `index` column `attno` equals `value`, compared by `procedure` in the column's collation.
///
/// # Safety
/// `index` is open and has a column `attno`.
pub(super) unsafe fn equal_key(index: pg_sys::Relation, attno: i16, procedure: u32, value: Datum) -> pg_sys::ScanKeyData {
    // SAFETY: plain-old-data, initialized by ScanKeyEntryInitialize; the collation array
    // has one entry per index column.
    unsafe {
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
}

/// `index` column `attno` equals the text `value`, or IS NULL for `None` (a NULLS NOT
/// DISTINCT index finds its NULL that way).
///
/// # Safety
/// `index` is open and has a text column `attno`.
pub(super) unsafe fn text_key(index: pg_sys::Relation, attno: i16, value: Option<&str>) -> pg_sys::ScanKeyData {
    match value {
        // SAFETY: this function's contract (an open index with a text column `attno`) covers
        // equal_key's, and texteq is text's equality.
        Some(v) => unsafe { equal_key(index, attno, pg_sys::F_TEXTEQ, text(v)) },
        // SAFETY: ScanKeyData is plain data, valid zeroed; an SK_SEARCHNULL key needs no
        // procedure, so ScanKeyEntryInitialize looks nothing up; `attno` exists per the contract.
        None => unsafe {
            let mut is_null: pg_sys::ScanKeyData = std::mem::zeroed();
            pg_sys::ScanKeyEntryInitialize(
                &mut is_null,
                (pg_sys::SK_ISNULL | pg_sys::SK_SEARCHNULL) as i32,
                attno,
                0,
                pg_sys::InvalidOid,
                pg_sys::InvalidOid,
                pg_sys::InvalidOid,
                Datum::from(0),
            );
            is_null
        },
    }
}
