//! A concurrency limit's slots, as locks in PostgreSQL's lock table: slot `i` of (name, key)
//! is held while some transaction holds its lock. The lock manager already does what a slot
//! needs: it ends with the transaction that took it (commit or abort, a subtransaction's
//! abort too, and a crash), and it is exclusive across every backend.
//!
//! The locks are advisory-type tags that no SQL advisory lock can name: field 1 the
//! database, fields 2 and 3 a hash of (name, key), field 4 the slot plus 4 (SQL's advisory
//! locks use 1 and 2). `pg_locks` shows them as advisory locks with `objsubid` 3 and up.

use pgrx::pg_sys;
use sha2::{Digest, Sha256};

/// Field 4 of the search lock, which keeps two calls on one (name, key) from probing its
/// slots at the same time (each would see the other's probe as a holder).
const SEARCH: u16 = 3;
/// Field 4 of slot 0.
const FIRST_SLOT: u16 = 4;

const EXCLUSIVE: pg_sys::LOCKMODE = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;

/// The slots of one (name, key) in this database.
#[derive(Clone, Copy)]
pub struct Slots {
    hash: [u32; 2],
}

/// What trying a slot found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tried {
    /// It was free and this transaction holds it now.
    Taken,
    /// This transaction held it already.
    Ours,
    /// Another transaction holds it.
    Theirs,
}

impl Slots {
    /// `stored_name` is the name as the state stores it (an inline config's with its
    /// fingerprint). SHA-256, so that no caller can choose a key whose slots are another's.
    pub fn of(stored_name: &str, key: Option<&str>) -> Slots {
        let mut hasher = Sha256::new();
        hasher.update(b"rate_limiter slots 1\0");
        hasher.update(stored_name.as_bytes());
        match key {
            Some(k) => {
                hasher.update([1]);
                hasher.update(k.as_bytes());
            }
            None => hasher.update([0]),
        }
        let digest = hasher.finalize();
        let word = |i: usize| u32::from_le_bytes(digest[i..i + 4].try_into().expect("4 bytes"));
        Slots { hash: [word(0), word(4)] }
    }

    fn tag(&self, field4: u16) -> pg_sys::LOCKTAG {
        pg_sys::LOCKTAG {
            // SAFETY: MyDatabaseId is set once at backend start, before any SQL runs.
            locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
            locktag_field2: self.hash[0],
            locktag_field3: self.hash[1],
            locktag_field4: field4,
            locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
            locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
        }
    }

    /// Try slot `slot` without waiting; a slot taken is held until the transaction (or the
    /// subtransaction that took it, if that aborts) ends, unless `give_back`.
    pub fn try_take(&self, slot: u32) -> Tried {
        let tag = self.tag(field4(slot));
        // SAFETY: a transaction-level lock of a valid tag, not waited for; the lock manager
        // records it under the current resource owner.
        let result = unsafe { pg_sys::LockAcquire(&tag, EXCLUSIVE, false, true) };
        match result {
            pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL => Tried::Theirs,
            pg_sys::LockAcquireResult::LOCKACQUIRE_OK => Tried::Taken,
            _ => {
                // Held already: the lock manager counted this try as a second hold; drop it,
                // keeping the first.
                self.give_back(slot);
                Tried::Ours
            }
        }
    }

    /// Take slot `slot` for the transaction, waiting for its holder to end (lock_timeout and
    /// cancels apply, and the deadlock detector).
    pub fn wait_for(&self, slot: u32) {
        let tag = self.tag(field4(slot));
        // SAFETY: a transaction-level lock of a valid tag, waited for as any lock is.
        unsafe { pg_sys::LockAcquire(&tag, EXCLUSIVE, false, false) };
    }

    /// Give back one hold of slot `slot` taken in this (sub)transaction.
    pub fn give_back(&self, slot: u32) {
        let tag = self.tag(field4(slot));
        // SAFETY: the tag of a lock this resource owner holds (`try_take` took it); releasing
        // one hold is what LockRelease does.
        unsafe { pg_sys::LockRelease(&tag, EXCLUSIVE, false) };
    }

    /// Wait for other calls' searches of these slots to end and keep new ones out until the
    /// guard drops. Held for as long as one pass over the slots takes, never while waiting
    /// for anything else, so waiting for it always ends.
    pub fn search(&self) -> Searching {
        let tag = self.tag(SEARCH);
        // SAFETY: a transaction-level lock of a valid tag, waited for as any lock is
        // (lock_timeout and cancels apply); released by the guard.
        unsafe { pg_sys::LockAcquire(&tag, EXCLUSIVE, false, false) };
        Searching { tag }
    }
}

fn field4(slot: u32) -> u16 {
    u16::try_from(slot).ok().and_then(|s| s.checked_add(FIRST_SLOT)).expect("at most MAX_SLOTS slots")
}

/// The search lock of one (name, key), released on drop (an error's abort releases it too).
pub struct Searching {
    tag: pg_sys::LOCKTAG,
}

impl Drop for Searching {
    fn drop(&mut self) {
        // SAFETY: the tag `search` acquired under this resource owner, released once.
        unsafe { pg_sys::LockRelease(&self.tag, EXCLUSIVE, false) };
    }
}
