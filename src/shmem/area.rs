//! The one thing the users of shared memory share: their named area.

use std::ffi::CStr;

use pgrx::pg_sys;

/// The area called `name` of `size` bytes, and whether it existed (else it is all zeros).
/// Only from `shmem_startup_hook`, holding AddinShmemInitLock.
pub fn area(name: &CStr, size: usize) -> (*mut u8, bool) {
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
