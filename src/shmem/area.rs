//! What the users of shared memory share: their named area, and holding an LWLock.

use std::ffi::CStr;

use pgrx::pg_sys;

/// The area called `name` of `size` bytes, and whether it existed (else it is all zeros).
///
/// A new area is not written here: PostgreSQL carves it from the segment it created at this
/// start (or restart after a crash; it never reuses an old segment's contents), which the
/// kernel hands out zero-filled (an anonymous `mmap`, or `shmget`). Writing the zeros again
/// touched every page of a table of a million memory keys (140 MB) at each start, where a
/// page untouched costs nothing until a key lands in it.
///
/// # Safety
/// Only from `shmem_startup_hook`, holding AddinShmemInitLock, for an area requested with
/// this size in `shmem_request_hook`.
pub unsafe fn area(name: &CStr, size: usize) -> (*mut u8, bool) {
    let mut found = false;
    // SAFETY: requested in `request` with this size; PostgreSQL raises an ERROR (FATAL in
    // the postmaster) rather than return too little.
    let area = unsafe { pg_sys::ShmemInitStruct(name.as_ptr(), size, &mut found).cast::<u8>() };
    // SAFETY: `size` bytes from `area`, aligned to a cache line by ShmemInitStruct, read by
    // the one process that set them up (the caller holds AddinShmemInitLock).
    debug_assert!(found || unsafe { all_zeros(area, size) }, "the new shared memory area {name:?} is not zero-filled");
    (area, found)
}

/// Whether the `size` bytes at `at` are all zeros: a check of debug builds, read a word at a time.
///
/// # Safety
/// `size` readable bytes at `at`, 8-aligned.
unsafe fn all_zeros(at: *const u8, size: usize) -> bool {
    // SAFETY: as the caller promises; whole words first, then the bytes after the last.
    let words = unsafe { std::slice::from_raw_parts(at.cast::<u64>(), size / 8) };
    // SAFETY: as above.
    let rest = unsafe { std::slice::from_raw_parts(at.add(size / 8 * 8), size % 8) };
    words.iter().all(|w| *w == 0) && rest.iter().all(|b| *b == 0)
}

/// Where the entries `E` that follow a header `H` start, in bytes from the area's start.
pub const fn entries_offset<H, E>() -> usize {
    size_of::<H>().next_multiple_of(align_of::<E>())
}

/// The bytes of an area holding a header `H` and then `n` entries `E`.
pub const fn table_size<H, E>(n: usize) -> usize {
    entries_offset::<H, E>() + n * size_of::<E>()
}

/// How many processes can call a function of the extension: the first `MaxBackends` of
/// `ProcGlobal`'s (backends, autovacuum, background workers and WAL senders; the auxiliary
/// processes and prepared transactions come after them).
pub fn processes() -> usize {
    // SAFETY: set before shared memory is requested (PostgreSQL 15 and later compute
    // MaxBackends before the request hook runs).
    unsafe { pg_sys::MaxBackends }.max(0) as usize
}

/// This backend's place among `ProcGlobal`'s processes (below `processes()` for any that
/// can call).
pub fn my_process() -> Option<usize> {
    // SAFETY: MyProc is this backend's PGPROC, an element of ProcGlobal->allProcs, both set
    // before any SQL runs (null only in processes without one).
    unsafe {
        if pg_sys::MyProc.is_null() || pg_sys::ProcGlobal.is_null() {
            return None;
        }
        let first = (*pg_sys::ProcGlobal).allProcs;
        Some(pg_sys::MyProc.offset_from(first) as usize)
    }
}

/// This backend's database, as the areas tag what is kept for it.
pub fn my_database() -> u32 {
    // SAFETY: MyDatabaseId is written only while the backend connects, before any SQL runs,
    // and backends are single-threaded, so this read cannot race a write.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// An LWLock held until dropped, on error paths too.
pub struct Held(*mut pg_sys::LWLock);

impl Held {
    /// # Safety
    /// `lock` is an initialized LWLock in shared memory that this backend does not hold.
    pub unsafe fn take(lock: *mut pg_sys::LWLock) -> Held {
        // SAFETY: the caller promises an initialized lock not held here; LWLockAcquire waits
        // or raises, and the guard releases it exactly once.
        unsafe { pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE) };
        Held(lock)
    }

    /// Held shared, beside other readers.
    ///
    /// # Safety
    /// As `take`.
    pub unsafe fn share(lock: *mut pg_sys::LWLock) -> Held {
        // SAFETY: as in `take`.
        unsafe { pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_SHARED) };
        Held(lock)
    }

    /// The lock if it is free now, without waiting.
    ///
    /// # Safety
    /// As `take`.
    pub unsafe fn try_take(lock: *mut pg_sys::LWLock) -> Option<Held> {
        // SAFETY: as in `take`; LWLockConditionalAcquire never waits.
        unsafe { pg_sys::LWLockConditionalAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE) }.then_some(Held(lock))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: this backend holds it (taken in `Held::take`), and releases it once.
        unsafe { pg_sys::LWLockRelease(self.0) }
    }
}
