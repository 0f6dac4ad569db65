//! The shape of every relation the code reads or writes by column position: each column's
//! name and type, in order. Each is checked every time it is opened, under its lock, so an
//! `ALTER TABLE` or `ALTER TYPE` (even one that committed while the call waited for the lock)
//! gives 55000 instead of a datum read as the wrong type.

use std::ffi::CStr;

use pgrx::pg_sys;

use crate::error::Error;

use super::server;

pub type Shape = [(&'static CStr, pg_sys::Oid)];

pub const STATE: [(&CStr, pg_sys::Oid); 8] = [
    (c"name", pg_sys::TEXTOID),
    (c"key", pg_sys::TEXTOID),
    (c"shard", pg_sys::INT2OID),
    (c"value", pg_sys::FLOAT8OID),
    (c"ts", pg_sys::TIMESTAMPTZOID),
    (c"expires", pg_sys::TIMESTAMPTZOID),
    (c"counts", pg_sys::FLOAT8ARRAYOID),
    (c"granted_at", pg_sys::TIMESTAMPTZOID),
];

/// What `storage::limit_row` reads, by position.
pub const LIMITS: [(&CStr, pg_sys::Oid); 14] = [
    (c"name", pg_sys::TEXTOID),
    (c"kind", pg_sys::TEXTOID),
    (c"rate", pg_sys::FLOAT8OID),
    (c"period", pg_sys::INTERVALOID),
    (c"capacity", pg_sys::FLOAT8OID),
    (c"max_reserved", pg_sys::FLOAT8OID),
    (c"shards", pg_sys::INT4OID),
    (c"start", pg_sys::TIMESTAMPTZOID),
    (c"min_gap", pg_sys::INTERVALOID),
    (c"mode", pg_sys::TEXTOID),
    (c"buckets", pg_sys::INT4OID),
    (c"lock_timeout", pg_sys::INTERVALOID),
    (c"on_lock_timeout", pg_sys::TEXTOID),
    (c"deny_cache", pg_sys::INTERVALOID),
];

/// `LIMITS` and 0.4.0's `hot` after it.
pub const LIMITS_WITH_HOT: [(&CStr, pg_sys::Oid); 15] = {
    let mut columns = [(c"hot", pg_sys::BOOLOID); 15];
    let mut i = 0;
    while i < LIMITS.len() {
        columns[i] = LIMITS[i];
        i += 1;
    }
    columns
};

/// `LIMITS_WITH_HOT` and 0.5.0's `enforce` and `tz` after it.
pub const LIMITS_SINCE_0_5_0: [(&CStr, pg_sys::Oid); 17] = {
    let mut columns = [(c"enforce", pg_sys::BOOLOID); 17];
    let mut i = 0;
    while i < LIMITS_WITH_HOT.len() {
        columns[i] = LIMITS_WITH_HOT[i];
        i += 1;
    }
    columns[16] = (c"tz", pg_sys::TEXTOID);
    columns
};

/// `LIMITS_SINCE_0_5_0` and 0.6.0's `durable` after it.
pub const LIMITS_SINCE_0_6_0: [(&CStr, pg_sys::Oid); 18] = {
    let mut columns = [(c"durable", pg_sys::BOOLOID); 18];
    let mut i = 0;
    while i < LIMITS_SINCE_0_5_0.len() {
        columns[i] = LIMITS_SINCE_0_5_0[i];
        i += 1;
    }
    columns
};

/// `rate_limiter.debits`, whose rows the hot path forms.
pub const DEBITS: [(&CStr, pg_sys::Oid); 5] = [
    (c"seq", pg_sys::INT8OID),
    (c"name", pg_sys::TEXTOID),
    (c"key", pg_sys::TEXTOID),
    (c"at", pg_sys::TIMESTAMPTZOID),
    (c"count", pg_sys::FLOAT8OID),
];

/// What the block and allow lists read, by position (`note` and `created` are for people).
pub const LISTS: [(&CStr, pg_sys::Oid); 3] =
    [(c"name", pg_sys::TEXTOID), (c"key", pg_sys::TEXTOID), (c"until", pg_sys::TIMESTAMPTZOID)];

/// What an override is read by, by position (`rate_limiter.overrides`, new in 0.7.0).
pub const OVERRIDES: [(&CStr, pg_sys::Oid); 10] = [
    (c"name", pg_sys::TEXTOID),
    (c"key", pg_sys::TEXTOID),
    (c"tier", pg_sys::TEXTOID),
    (c"rate", pg_sys::FLOAT8OID),
    (c"period", pg_sys::INTERVALOID),
    (c"capacity", pg_sys::FLOAT8OID),
    (c"max_reserved", pg_sys::FLOAT8OID),
    (c"min_gap", pg_sys::INTERVALOID),
    (c"exempt", pg_sys::BOOLOID),
    (c"until", pg_sys::TIMESTAMPTZOID),
];

/// What a tier is read by, by position (`rate_limiter.tiers`, new in 0.7.0).
pub const TIERS: [(&CStr, pg_sys::Oid); 8] = [
    (c"name", pg_sys::TEXTOID),
    (c"tier", pg_sys::TEXTOID),
    (c"rate", pg_sys::FLOAT8OID),
    (c"period", pg_sys::INTERVALOID),
    (c"capacity", pg_sys::FLOAT8OID),
    (c"max_reserved", pg_sys::FLOAT8OID),
    (c"min_gap", pg_sys::INTERVALOID),
    (c"exempt", pg_sys::BOOLOID),
];

/// What `api` forms a decision from, by position.
pub const DECISION: [(&CStr, pg_sys::Oid); 7] = [
    (c"ok", pg_sys::BOOLOID),
    (c"retry_after", pg_sys::FLOAT8OID),
    (c"remaining", pg_sys::FLOAT8OID),
    (c"reset_after", pg_sys::FLOAT8OID),
    (c"granted", pg_sys::FLOAT8OID),
    (c"reason", pg_sys::TEXTOID),
    (c"limited_by", pg_sys::TEXTOID),
];

/// What `acquire` returns: a decision and the lease's id.
pub const ACQUIRED: [(&CStr, pg_sys::Oid); 8] = [
    (c"ok", pg_sys::BOOLOID),
    (c"retry_after", pg_sys::FLOAT8OID),
    (c"remaining", pg_sys::FLOAT8OID),
    (c"reset_after", pg_sys::FLOAT8OID),
    (c"granted", pg_sys::FLOAT8OID),
    (c"reason", pg_sys::TEXTOID),
    (c"limited_by", pg_sys::TEXTOID),
    (c"lease_id", pg_sys::UUIDOID),
];

/// Whether a relation may have columns after the ones the code uses (a table it only
/// reads), or must have exactly those (one it forms rows of).
#[derive(Clone, Copy, PartialEq)]
pub enum Columns {
    Exactly,
    AtLeast,
}

/// 55000 unless the row descriptor of `shown` has `shape`'s columns, by name and type, at
/// their positions, none of them dropped.
///
/// # Safety
/// `desc` is a valid descriptor (of an open, locked relation, or pinned from the type cache).
pub unsafe fn require(desc: pg_sys::TupleDesc, shown: &str, shape: &Shape, columns: Columns) {
    // SAFETY: the caller's contract.
    if let Some(detail) = unsafe { difference(desc, shape, columns) } {
        Error::ShapeChanged { relation: shown.to_owned(), detail }.raise()
    }
}

/// What differs between a row descriptor and `shape`, said for a person; `None` if nothing.
/// It runs at every call, twice: the common answer, nothing, allocates nothing and compares
/// each name's bytes against the NameData in place (no strlen).
///
/// # Safety
/// `desc` is a valid descriptor.
pub unsafe fn difference(desc: pg_sys::TupleDesc, shape: &Shape, columns: Columns) -> Option<String> {
    // SAFETY: the caller's contract.
    let natts = unsafe { (*desc).natts } as usize;
    if natts < shape.len() || (columns == Columns::Exactly && natts > shape.len()) {
        return Some(format!("it has {natts} columns where the extension made {}", shape.len()));
    }
    shape.iter().enumerate().find_map(|(i, (name, ty))| {
        // SAFETY: `i` < `shape.len()` <= natts, the descriptor's attributes.
        let attr = unsafe { server::attribute(desc, i) };
        let wanted = name.to_bytes_with_nul();
        // SAFETY: NameData holds NAMEDATALEN (64) bytes, more than any name of a shape with
        // its NUL; read as bytes, the comparison is one memcmp.
        let stored = unsafe { std::slice::from_raw_parts(attr.attname.data.as_ptr().cast::<u8>(), wanted.len()) };
        let same_name = stored == wanted;
        if !attr.attisdropped && same_name && attr.atttypid == *ty {
            return None;
        }
        // SAFETY: attname is a NUL-terminated NameData.
        let actual = unsafe { CStr::from_ptr(attr.attname.data.as_ptr()) };
        Some(format!(
            "column {} should be {} of type OID {}, not {}{} of type OID {}",
            i + 1,
            name.to_string_lossy(),
            ty.to_u32(),
            if attr.attisdropped { "a dropped column " } else { "" },
            actual.to_string_lossy(),
            attr.atttypid.to_u32()
        ))
    })
}

/// Whether an open index is a plain one on exactly `columns` (unique if `unique`): no
/// expression and no predicate (a partial index would miss rows). The extension reads through
/// its indexes by column position, so an index its owner replaced under the same name must be
/// refused, never scanned.
///
/// # Safety
/// `index` is open.
pub unsafe fn index_has(index: pg_sys::Relation, unique: bool, columns: &[i16]) -> bool {
    // SAFETY: an open index has its pg_index row, whose `indkey` holds `indnatts` column
    // numbers; expressions and predicate are NULL columns of that row when absent.
    unsafe {
        let form = &*(*index).rd_index;
        let row = (*index).rd_indextuple;
        let plain = pg_sys::heap_attisnull(row, pg_sys::Anum_pg_index_indexprs as i32, std::ptr::null_mut())
            && pg_sys::heap_attisnull(row, pg_sys::Anum_pg_index_indpred as i32, std::ptr::null_mut());
        (form.indisunique || !unique) && plain && form.indkey.values.as_slice(form.indnatts as usize) == columns
    }
}

/// Whether an open index can be scanned: valid and live, not a build that failed.
///
/// # Safety
/// `index` is open.
pub unsafe fn index_usable(index: pg_sys::Relation) -> bool {
    // SAFETY: an open index has its pg_index row.
    let form = unsafe { &*(*index).rd_index };
    form.indisvalid && form.indislive
}

/// `index_has`, and usable for a scan.
///
/// # Safety
/// `index` is open.
pub unsafe fn index_is(index: pg_sys::Relation, unique: bool, columns: &[i16]) -> bool {
    // SAFETY: the caller's contract.
    unsafe { index_has(index, unique, columns) && index_usable(index) }
}

/// 55000 unless `heap`, written here through heapam as the executor would, is a heap table
/// without CHECK constraints: another table access method's pages are not heap pages, and a
/// direct write checks no constraint.
///
/// # Safety
/// `heap` is open and locked.
pub unsafe fn require_plain_heap(heap: pg_sys::Relation, shown: &str) {
    // SAFETY: an open relation's pg_class row and descriptor.
    let (heap_am, checks) = unsafe {
        let constraints = (*(*heap).rd_att).constr;
        ((*(*heap).rd_rel).relam == pg_sys::HEAP_TABLE_AM_OID, !constraints.is_null() && (*constraints).num_check > 0)
    };
    if !heap_am || checks {
        let detail = if heap_am { "it has a CHECK constraint" } else { "its table access method is not heap" };
        Error::ShapeChanged { relation: shown.to_owned(), detail: detail.to_owned() }.raise()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_of_a_shape_fits_a_name_data_with_its_nul() {
        for shape in [&STATE[..], &LIMITS_SINCE_0_6_0, &DEBITS, &LISTS, &DECISION, &ACQUIRED] {
            for (name, _) in shape {
                assert!(name.to_bytes_with_nul().len() <= pg_sys::NAMEDATALEN as usize, "{name:?}");
            }
        }
    }
}
