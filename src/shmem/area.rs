//! What the users of shared memory share: their named area, and holding an LWLock.

use std::ffi::CStr;

use pgrx::pg_sys;

/// The area called `name` of `size` bytes, and whether it existed (else it is all zeros).
///
/// # Safety
/// Only from `shmem_startup_hook`, holding AddinShmemInitLock, for an area requested with
/// this size in `shmem_request_hook`.
pub unsafe fn area(name: &CStr, size: usize) -> (*mut u8, bool) {
    let mut found = false;
    // SAFETY: requested in `request` with this size; PostgreSQL raises an ERROR (FATAL in
    // the postmaster) rather than return too little.
    unsafe {
        let area = pg_sys::ShmemInitStruct(name.as_ptr(), size, &mut found).cast::<u8>();
        if !found {
            std::ptr::write_bytes(area, 0, size);
        }
        (area, found)
    }
}

/// Where the entries `E` that follow a header `H` start, in bytes from the area's start.
pub const fn entries_offset<H, E>() -> usize {
    size_of::<H>().next_multiple_of(align_of::<E>())
}

/// The bytes of an area holding a header `H` and then `n` entries `E`.
pub const fn table_size<H, E>(n: usize) -> usize {
    entries_offset::<H, E>() + n * size_of::<E>()
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
