//! The descriptor of `rate_limiter.decision`, the row every call returns: looked up in the
//! type cache and checked for its shape once per generation of the backend's caches
//! (`cache::generation`), not at every call. A change of the type (an `ALTER TYPE` that
//! committed while a call waited) invalidates its relation, which moves the generation on:
//! the next call, which takes invalidations in first, looks it up and checks it again.

use std::cell::Cell;

use pgrx::pg_sys;

use crate::cache;

use super::shape;

thread_local! {
    /// A copy of the checked descriptor in the backend's top memory context, and the cache
    /// generation it belongs to.
    static CHECKED: Cell<Option<(u64, pg_sys::TupleDesc)>> = const { Cell::new(None) };
}

/// The decision type's descriptor, its columns exactly `shape::DECISION` (55000 otherwise).
/// Valid until the caller next takes invalidations in (a lookup, a lock): a caller forms its
/// row with it at once.
pub fn descriptor() -> pg_sys::TupleDesc {
    let generation = cache::generation();
    if let Some((checked, desc)) = CHECKED.get() {
        if checked == generation {
            return desc;
        }
    }
    let pinned = PinnedRowType::of(cache::relations().decision_type);
    // SAFETY: `pinned` holds a reference count on the type cache's descriptor until it drops
    // at the end of this function, so the descriptor stays valid throughout.
    unsafe { shape::require(pinned.0, "rate_limiter.decision", &shape::DECISION, shape::Columns::Exactly) };
    // SAFETY: copies a valid, pinned descriptor into a context that lives as long as the
    // backend; nothing else points to the copy, which holds no reference count.
    let copy = unsafe { pgrx::PgMemoryContexts::TopMemoryContext.switch_to(|_| pg_sys::CreateTupleDescCopy(pinned.0)) };
    // The last generation's copy (if any): no caller holds it past the call that got it.
    if let Some((_, old)) = CHECKED.replace(Some((generation, copy))) {
        // SAFETY: made by CreateTupleDescCopy above in an earlier call, and no longer handed out.
        unsafe { pg_sys::FreeTupleDesc(old) };
    }
    copy
}

/// A row type's descriptor from the type cache, pinned until dropped (on error paths too).
struct PinnedRowType(pg_sys::TupleDesc);

impl PinnedRowType {
    fn of(row_type: pg_sys::Oid) -> PinnedRowType {
        // SAFETY: looks up a composite type by OID (raises if it is gone); the reference
        // count it takes is given back once, on drop.
        PinnedRowType(unsafe { pg_sys::lookup_rowtype_tupdesc(row_type, -1) })
    }
}

impl Drop for PinnedRowType {
    fn drop(&mut self) {
        // SAFETY: `self.0` carries the one reference count `of` took (nothing else builds a
        // PinnedRowType), and drop runs once, so it is given back exactly once.
        unsafe { pg_sys::DecrTupleDescRefCount(self.0) }
    }
}
