//! The extension's tables through PostgreSQL's access methods and plain SQL, split by job:
//! `state` finds, locks and writes rows of `rate_limiter.state` (the executor's work, done
//! here), with `row` what it deals in; `lookup` reads committed rows of
//! `rate_limiter.limits` and `rate_limiter.blocks`; `sql` runs the plain SPI statements of
//! prune, blocks and define; `scan` holds the index probes they share; `shape` the columns of
//! every relation read by position; `server` every server call whose signature differs
//! between the supported PostgreSQL majors. This file holds what the writers share.
//!
//! The limiter's functions are the only way into these tables, so no table privilege is
//! checked on the access-method paths; EXECUTE on the function is the permission.

use pgrx::pg_sys::{self, Datum};
use pgrx::IntoDatum;

use crate::clock;
use crate::error::Error;

mod debits;
pub mod leases;
mod lookup;
mod row;
mod scan;
mod server;
pub mod shape;
pub mod slots;
mod sql;
mod state;

pub use debits::{log_is_subscribed, DebitLog, Seen};
pub use lookup::{load_limit, Lookup};
pub use sql::{delete, delete_listed, prune, upsert_limit, upsert_listed};
pub use row::{inline_name, is_inline_name, stored_name, Created, Locked, Owner, Row, Slot, Written};
pub use server::die_on_sigterm;
pub use state::StateTable;

/// As core commands do: 25006 in a read-only transaction (and on a standby), 25000 in a
/// parallel worker, before anything is attempted.
pub fn prevent_writes_unless_allowed(command: &std::ffi::CStr) {
    // SAFETY: `command` is a CStr, NUL-terminated and alive for both calls; they only read
    // this backend's transaction state and raise an ERROR when writing is not allowed.
    unsafe {
        pg_sys::PreventCommandIfReadOnly(command.as_ptr());
        pg_sys::PreventCommandIfParallelMode(command.as_ptr());
    }
}

/// Wait for every transaction that called a limit to end, and keep new calls out until this
/// one ends: `SHARE ROW EXCLUSIVE` on `rate_limiter.state`, which every consuming call holds
/// in `ROW EXCLUSIVE` (what a change of a hot limit needs, docs/hot-limits.md).
pub fn hold_calls_off() {
    // SAFETY: locks the extension's table by the OID the cache checked; held to the end of
    // the transaction, and waited for as any lock is (lock_timeout and cancels apply).
    unsafe { pg_sys::LockRelationOid(crate::cache::relations().state, pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE) }
}

/// The latest snapshot, registered until dropped: what every transaction committed by now,
/// one view for several reads that must agree (a hot key's base row and its log).
pub struct Latest(pg_sys::Snapshot);

impl Latest {
    pub fn take() -> Latest {
        // SAFETY: inside a transaction, as every call is; registered, so it lives until drop.
        Latest(unsafe { pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot()) })
    }

    pub fn snapshot(&self) -> pg_sys::Snapshot {
        self.0
    }
}

impl Drop for Latest {
    fn drop(&mut self) {
        // SAFETY: registered by `take`, unregistered once.
        unsafe { pg_sys::UnregisterSnapshot(self.0) }
    }
}

/// Whether the transaction reads with one snapshot (REPEATABLE READ, SERIALIZABLE).
fn xact_snapshot_isolation() -> bool {
    // SAFETY: XactIsoLevel is a plain int of this single-threaded backend, set at transaction
    // start or by SET TRANSACTION, never while this reads it.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

fn text(s: &str) -> Datum {
    s.into_datum().expect("text is never NULL")
}

/// A timestamptz datum for `ms`, or 22008 when PostgreSQL cannot store that instant.
fn instant(ms: f64, what: &str) -> Datum {
    match clock::ms_to_pg_us(ms) {
        Some(us) => Datum::from(us),
        None => Error::TimeOutOfRange(format!("the state's {what} would be {ms} ms since the epoch")).raise(),
    }
}
