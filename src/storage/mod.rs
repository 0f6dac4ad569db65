//! The extension's tables through PostgreSQL's access methods and plain SQL, split by job:
//! `state` finds, locks and writes rows of `rate_limiter.state` (the executor's work, done
//! here), with `row` what it deals in; `lookup` reads committed rows of
//! `rate_limiter.limits` and `rate_limiter.blocks`; `sql` runs the plain SPI statements of
//! prune, blocks and define; `scan` holds the index probes they share; `shape` the columns of
//! every relation read by position, and `decision_type` the checked descriptor of the row every
//! call returns; `server` every server call whose signature differs
//! between the supported PostgreSQL majors. This file holds what the writers share.
//!
//! The limiter's functions are the only way into these tables, so no table privilege is
//! checked on the access-method paths; EXECUTE on the function is the permission.

use pgrx::pg_sys::{self, Datum};
use pgrx::IntoDatum;

use crate::clock;
use crate::error::Error;
use held_locks::HeldLock;

mod debits;
pub mod decision_type;
mod guard;
pub mod held_locks;
pub mod leases;
mod lookup;
mod row;
mod scan;
mod server;
pub mod shape;
pub mod slots;
pub mod snapshot;
mod spi;
mod sql;
mod state;
pub mod write_limits;

pub use debits::{log_is_subscribed, DebitLog, Seen};
pub use lookup::{all_limits, any_override, load_limit, load_override, load_tier, overridden_keys, Lookup, Overriding};
pub use sql::{
    delete, delete_listed, delete_override, delete_overrides_of, delete_tier, has_overrides_ending, hold_for_override, keys_in_tier, numbers_given, overrides_naming, overrides_naming_any_tier, prune,
    upsert_limit,
    upsert_listed, upsert_override, upsert_tier,
};
#[cfg(any(test, feature = "pg_test"))]
pub use row::inline_name;
pub use row::{is_inline_name, stored_name, Created, Locked, Owner, Row, Slot, Written};
pub use server::{die_on_sigterm, my_transaction, wait_for_transaction};
pub use state::StateTable;

/// The extension's table `table` (shown as `shown`) opened and locked in `lockmode`, to the
/// end of the transaction; 42P01 if it is gone: a DROP EXTENSION that committed while this
/// call waited for the lock leaves only the OID the cache found before it (an ERROR of the
/// server's own would be XX000).
pub fn open_table(table: pg_sys::Oid, lockmode: pg_sys::LOCKMODE, shown: &str) -> pg_sys::Relation {
    // SAFETY: inside a transaction; try_table_open locks first and returns null, not a
    // dangling relation, when the OID names no relation once locked.
    let relation = unsafe { pg_sys::try_table_open(table, lockmode) };
    if relation.is_null() {
        Error::RelationGone(shown.to_owned()).raise()
    }
    relation
}

/// Whether a `Drop` that holds buffers (an index scan, a slot, a relation) runs while unwinding
/// from an error: then it leaves them to the (sub)transaction's abort, which releases every
/// LWLock first. The server may have raised the error with a buffer's content lock held (a
/// serialization failure found during a heap fetch), and unpinning that buffer still locked
/// fails an assertion of the server's.
pub(super) fn unwinding() -> bool {
    std::thread::panicking()
}

/// The index `index` of a table this transaction holds locked (which keeps it from being
/// dropped), opened in `lockmode`; 42P01 if the OID, found before the table's lock was
/// taken, names no relation now (an index replaced meanwhile, as ALTER TABLE ... DROP
/// CONSTRAINT, ADD CONSTRAINT does).
pub fn open_index(index: pg_sys::Oid, lockmode: pg_sys::LOCKMODE, shown: &str) -> pg_sys::Relation {
    // SAFETY: a syscache lookup by OID inside a transaction; '\0' for a missing relation.
    let kind = unsafe { pg_sys::get_rel_relkind(index) };
    if kind != pg_sys::RELKIND_INDEX as std::ffi::c_char {
        Error::RelationGone(format!("the index of {shown}")).raise()
    }
    // SAFETY: an index of a table this transaction holds locked: it cannot be dropped before
    // index_open locks it too.
    unsafe { pg_sys::index_open(index, lockmode) }
}

/// As core commands do: 25006 in a read-only transaction (and on a standby), 25000 in a
/// parallel worker, before anything is attempted.
pub fn prevent_writes_unless_allowed(command: &std::ffi::CStr) {
    // SAFETY: `command` is a CStr, NUL-terminated and alive for the call, which only reads
    // this backend's transaction state and raises an ERROR when writing is not allowed.
    unsafe { pg_sys::PreventCommandIfReadOnly(command.as_ptr()) };
    prevent_in_parallel_mode(command);
}

/// 25000 in parallel mode, as core commands raise it; the guarded call only when it raises.
pub fn prevent_in_parallel_mode(command: &std::ffi::CStr) {
    if crate::unguarded::in_parallel_mode() {
        // SAFETY: `command` is NUL-terminated and alive for the call, which raises.
        unsafe { pg_sys::PreventCommandIfParallelMode(command.as_ptr()) }
    }
}

/// Whether this database subscribes to `table` (it is in `pg_subscription_rel`): its rows
/// then arrive from a publisher.
pub fn subscribed(table: pg_sys::Oid) -> bool {
    // pg_subscription_rel, its (srrelid, srsubid) index and srrelid: fixed in the catalog
    // headers of every supported version, not in pgrx's bindings.
    const SUBSCRIPTION_REL: u32 = 6102;
    const BY_RELATION: u32 = 6117;
    const SRRELID: pg_sys::AttrNumber = 2;
    // SAFETY: inside the caller's transaction; a catalog scan by its own unique index, ended
    // and closed before returning, reading no column.
    unsafe {
        let catalog = pg_sys::table_open(pg_sys::Oid::from(SUBSCRIPTION_REL), pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let mut key = pg_sys::ScanKeyData::default();
        pg_sys::ScanKeyInit(&mut key, SRRELID, pg_sys::BTEqualStrategyNumber as u16, pg_sys::F_OIDEQ.into(), table.into());
        let scan = pg_sys::systable_beginscan(catalog, pg_sys::Oid::from(BY_RELATION), true, std::ptr::null_mut(), 1, &mut key);
        let subscribed = !pg_sys::systable_getnext(scan).is_null();
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(catalog, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        subscribed
    }
}

/// 25006 on a standby, as a core command that needs the primary: `command` takes slot locks
/// the primary never sees.
pub fn prevent_during_recovery(command: &std::ffi::CStr) {
    // SAFETY: `command` is NUL-terminated and alive for the call, which only reads whether
    // recovery is in progress and raises an ERROR if so.
    unsafe { pg_sys::PreventCommandDuringRecovery(command.as_ptr()) }
}

/// The table's part of `shmem::gate::hold_calls_off`: wait for every transaction that holds
/// `rate_limiter.state`'s lock for a call (`ROW EXCLUSIVE`) to end, and keep new ones out
/// until this one ends, in `SHARE ROW EXCLUSIVE`.
pub fn lock_out_calls() {
    // SAFETY: locks the extension's table by the OID the cache checked; held to the end of
    // the transaction, and waited for as any lock is (lock_timeout and cancels apply).
    unsafe { pg_sys::LockRelationOid(crate::cache::relations().state, pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE) }
}

/// Whether the server is a standby (or recovering): it writes nothing.
pub fn in_recovery() -> bool {
    crate::unguarded::recovery_in_progress()
}

/// `field4` of the advisory lock tag that serializes where a memory limit's key is counted
/// (`pg_advisory_lock` uses 1 and 2, the creators of a row `CREATE_LOCK_SPACE`).
const MEMORY_KEY_LOCK_SPACE: u16 = 0x524d; // "RM"

/// The lock of memory key `key` (its 128-bit tag) in this database.
fn memory_key_tag(key: &[u8; 16]) -> pg_sys::LOCKTAG {
    let half = |at: usize| u32::from_le_bytes(key[at..at + 4].try_into().expect("4 bytes"));
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is written only while the backend connects, before any SQL runs.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.into(),
        locktag_field2: half(0) ^ half(8),
        locktag_field3: half(4) ^ half(12),
        locktag_field4: MEMORY_KEY_LOCK_SPACE,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// Hold memory key `key` until the transaction ends, or `release_memory_key`: while a key
/// is not in shared memory, the calls that look for its row, or count it there, take turns.
/// At most `rate_limiter.max_memory_key_locks_per_transaction` keys a transaction (53400
/// past it): each is an entry of the lock table every database shares. Whether this took it
/// (rather than held it already).
pub fn lock_memory_key(key: &[u8; 16]) -> bool {
    let tag = memory_key_tag(key);
    // SAFETY: a transaction-level advisory lock, released by the server when the transaction
    // ends; waited for as any lock is (deadlock detection, lock_timeout, cancels apply).
    let result = unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, false) };
    if result != pg_sys::LockAcquireResult::LOCKACQUIRE_OK {
        return false;
    }
    let held = held_locks::held(HeldLock::MemoryKey);
    if held >= crate::settings::MAX_MEMORY_KEY_LOCKS_PER_TRANSACTION.get() as u32 {
        // SAFETY: as in release_memory_key: the hold just taken, not counted.
        unsafe { pg_sys::LockRelease(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false) };
        Error::MemoryKeyLocksPerTransaction(held).raise()
    }
    held_locks::count_held(HeldLock::MemoryKey, 1);
    true
}

/// Let go of one hold of memory key `key`'s lock before the transaction ends: the key found
/// its entry in shared memory, where every later call finds it without the lock. `taken`:
/// what `lock_memory_key` answered (a hold taken before stays counted and held).
pub fn release_memory_key(key: &[u8; 16], taken: bool) {
    if !taken {
        return;
    }
    // SAFETY: the tag of a lock `lock_memory_key` took under this resource owner, in this
    // subtransaction; LockRelease drops that hold.
    unsafe { pg_sys::LockRelease(&memory_key_tag(key), pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false) };
    held_locks::count_released(HeldLock::MemoryKey);
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
