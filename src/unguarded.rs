//! The server functions a call makes on every request that never raise an ERROR, called
//! without pgrx's guard. pgrx wraps each `pg_sys` function in a `sigsetjmp` that turns a
//! server ERROR into a Rust panic: about 85 instructions a call, and a memory limit's call
//! made about twenty of them (issue 66). A function that cannot raise cannot `longjmp` over
//! a Rust frame, so it needs no guard. Each one's body is checked in PostgreSQL 15 to 18:
//! they read this backend's state or the system clock, and neither allocate nor lock.

use pgrx::pg_sys;

mod server {
    use pgrx::pg_sys::{SubTransactionId, TimestampTz};

    extern "C" {
        pub fn GetCurrentTimestamp() -> TimestampTz;
        pub fn RecoveryInProgress() -> bool;
        pub fn GetCurrentSubTransactionId() -> SubTransactionId;
        pub fn IsInParallelMode() -> bool;
    }
}

/// Now, as PostgreSQL's microseconds since 2000-01-01 (`gettimeofday`).
pub fn current_timestamp() -> pg_sys::TimestampTz {
    // SAFETY: reads the system clock; no preconditions, never raises.
    unsafe { server::GetCurrentTimestamp() }
}

/// Whether the server is still in recovery: a read of shared memory until it is seen over,
/// then of a variable of the backend's own.
pub fn recovery_in_progress() -> bool {
    // SAFETY: reads XLogCtl (set up before any backend runs) without a lock; never raises.
    unsafe { server::RecoveryInProgress() }
}

/// The current subtransaction's id (a field of the backend's transaction state).
pub fn current_subtransaction() -> pg_sys::SubTransactionId {
    // SAFETY: reads CurrentTransactionState, which always points at a valid state; never raises.
    unsafe { server::GetCurrentSubTransactionId() }
}

/// Whether the backend is in parallel mode, where no command may write.
pub fn in_parallel_mode() -> bool {
    // SAFETY: reads CurrentTransactionState's fields; never raises.
    unsafe { server::IsInParallelMode() }
}
