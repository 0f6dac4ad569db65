//! What names a memory limit's entry, and where it may live: a keyed hash (SipHash-1-3, 128
//! bits) of the database, the extension's incarnation, the limit's name and the key, under a
//! secret of the cluster that no role can read. Without the secret no caller can tell which
//! keys land in the same partitions, so none can be aimed at another (docs/memory-limits.md).
//!
//! The secret is a file of the data directory, made at the first start with the library:
//! a base backup copies it, so that a standby places keys as its primary does and loads the
//! primary's snapshot at its promotion. A new secret (the file lost) only makes the saved
//! counts match no key: they start full, as after a crash without a snapshot. Beside it, the
//! system identifier it was made under: a copy that became a cluster of its own under another
//! identifier (pg_createsubscriber gives its logical subscriber one) makes a secret of its own,
//! and so an origin of its own in the snapshot log, which it may receive its publisher's.

use std::hash::Hasher;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use pgrx::pg_sys;
use siphasher::sip128::{Hasher128, SipHasher13};

/// In the data directory (the postmaster's working directory).
const SECRET_FILE: &str = "rate_limiter_memory.secret";
/// The system identifier (pg_control's) the secret was made under, as decimal text.
const SYSTEM_FILE: &str = "rate_limiter_memory.system";

/// The entry of (limit, key) under the named limit or one inline config of its name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Identity {
    pub(super) key: [u64; 2],
    /// The limit's tag, to forget or retune all its keys.
    pub(super) limit: u64,
    /// 0: the named limit; else the inline config's fingerprint (`config_tag`).
    pub(super) variant: u64,
}

/// Parts up to this many bytes in all (lengths included) are hashed in one write: SipHash
/// hashes a byte string alike however it is split, and one write of a call's key costs half
/// of eight small ones.
const ONE_WRITE: usize = 128;

fn keyed(secret: [u64; 2], parts: &[&[u8]]) -> SipHasher13 {
    let mut h = SipHasher13::new_with_keys(secret[0], secret[1]);
    let mut buffer = [0u8; ONE_WRITE];
    let mut used = 0;
    for part in parts {
        // Each part's length first, so that no two lists of parts hash alike.
        let length = (part.len() as u64).to_le_bytes();
        if used + length.len() + part.len() <= ONE_WRITE {
            buffer[used..used + length.len()].copy_from_slice(&length);
            buffer[used + length.len()..used + length.len() + part.len()].copy_from_slice(part);
            used += length.len() + part.len();
        } else {
            h.write(&buffer[..used]);
            used = 0;
            h.write(&length);
            h.write(part);
        }
    }
    h.write(&buffer[..used]);
    h
}

impl Identity {
    /// (limit `name`, `key`) of the extension's incarnation `install` (an OID that changes
    /// when the extension is created again) in `database`; `inline` an inline config's
    /// fingerprint.
    pub(super) fn new(secret: [u64; 2], database: u32, install: u32, name: &str, key: Option<&str>, inline: Option<&[u8; 16]>) -> Identity {
        let limit = limit_tag(secret, database, install, name);
        let key_part: &[u8] = key.map_or(b"", str::as_bytes);
        let hash = keyed(secret, &[b"memory key", &limit.to_le_bytes(), &[u8::from(key.is_some())], key_part]).finish128();
        Identity { key: [hash.h1, hash.h2], limit, variant: inline.map_or(0, config_tag) }
    }

    /// The same (limit, key), under any config of the name.
    pub fn same_key(&self, other: &Identity) -> bool {
        self.key == other.key
    }

    /// The key's tag as the snapshot table's rows begin with it.
    pub fn key_bytes(&self) -> [u8; 16] {
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&self.key[0].to_le_bytes());
        bytes[8..].copy_from_slice(&self.key[1].to_le_bytes());
        bytes
    }

    pub fn limit_tag(&self) -> u64 {
        self.limit
    }

    /// The two partitions (of `partitions`) where the entry may be: the less full one takes
    /// a new key, so that partitions fill evenly.
    pub(super) fn partitions(&self, partitions: usize) -> [usize; 2] {
        let n = partitions as u64;
        let first = (self.key[0] % n) as usize;
        let second = (self.key[1] % n) as usize;
        if second == first && partitions > 1 {
            [first, (first + 1) % partitions]
        } else {
            [first, second]
        }
    }

    /// What the index keeps to find the entry: bits of the key other than those that pick
    /// its partitions (for the partitions a table can have), never 0 (a free entry's).
    pub(super) fn index_tag(&self) -> u32 {
        ((self.key[0] >> 40) as u32 ^ (self.key[1] >> 40) as u32) | 1
    }
}

/// The tag of limit `name` of `install` in `database`; the last one computed is kept, as a
/// backend calls the same limit again and again.
pub(super) fn limit_tag(secret: [u64; 2], database: u32, install: u32, name: &str) -> u64 {
    thread_local! {
        static LAST: std::cell::RefCell<(u32, u32, String, u64)> = const { std::cell::RefCell::new((0, 0, String::new(), 0)) };
    }
    LAST.with_borrow_mut(|(last_database, last_install, last_name, tag)| {
        if (*last_database, *last_install) != (database, install) || last_name != name || *tag == 0 {
            *tag = keyed(secret, &[b"memory limit", &database.to_le_bytes(), &install.to_le_bytes(), name.as_bytes()]).finish() | 1;
            (*last_database, *last_install, *last_name) = (database, install, name.to_owned());
        }
        *tag
    })
}

/// The snapshot log's rows of this cluster and its physical standbys (which share the
/// secret): a logical subscriber receives a publisher's rows, under another origin, and
/// neither loads nor deletes them.
pub(super) fn snapshot_origin(secret: [u64; 2]) -> i64 {
    keyed(secret, &[b"memory snapshot origin"]).finish() as i64
}

/// A config's fingerprint as an entry keeps it: 64 of its bits, never 0.
pub fn config_tag(fingerprint: &[u8; 16]) -> u64 {
    u64::from_le_bytes(fingerprint[..8].try_into().expect("8 bytes")) | 1
}

/// The cluster's secret: read from its file, or made and written there at the first start.
/// Only in the postmaster, before any backend runs.
pub(super) fn cluster_secret() -> [u64; 2] {
    // SAFETY: the postmaster has read pg_control before it makes shared memory.
    let system = unsafe { pg_sys::GetSystemIdentifier() }.to_string();
    let made_under = std::fs::read_to_string(SYSTEM_FILE).ok();
    if let Ok(bytes) = std::fs::read(SECRET_FILE) {
        match <[u8; 16]>::try_from(bytes.as_slice()) {
            // A secret from before the file of its identifier (0.7.0) is this cluster's.
            Ok(bytes) if made_under.as_deref().is_none_or(|id| id.trim() == system) => {
                if made_under.is_none() {
                    write_system_file(&system);
                }
                return secret_of(bytes);
            }
            Ok(_) => pgrx::log!(
                "rate_limiter: the memory limits' secret was made under another system identifier: this cluster was copied and is one of its own now (as pg_createsubscriber makes one), so a new secret is made, and with it an origin of its own in rate_limiter.memory_snapshot"
            ),
            Err(_) => pgrx::warning!("rate_limiter: {SECRET_FILE} is not 16 bytes: a new secret is made, and saved memory limit counts match no key"),
        }
    }
    let mut bytes = [0u8; 16];
    // SAFETY: a buffer of 16 writable bytes.
    if !unsafe { pg_sys::pg_strong_random(bytes.as_mut_ptr().cast(), bytes.len()) } {
        pgrx::error!("rate_limiter: no strong random bytes for the memory limits' secret");
    }
    match write_file(SECRET_FILE, &bytes) {
        Ok(()) => write_system_file(&system),
        Err(e) => pgrx::warning!(
            "rate_limiter: the memory limits' secret was not written to {SECRET_FILE} ({e}): counts saved now match no key after a restart"
        ),
    }
    secret_of(bytes)
}

/// Record the system identifier the secret was made under. Without the file, the next start
/// takes the secret as this cluster's, as it took a secret from before the file.
fn write_system_file(system: &str) {
    if let Err(e) = write_file(SYSTEM_FILE, system.as_bytes()) {
        pgrx::warning!("rate_limiter: the system identifier was not written to {SYSTEM_FILE} ({e}): a copy of this cluster under another identifier keeps its secret");
    }
}

/// Write `bytes` to `name` in the data directory, whole or not at all.
fn write_file(name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = format!("{name}.tmp");
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(tmp, name)
}

/// SipHash's two keys from the secret's 16 bytes.
fn secret_of(bytes: [u8; 16]) -> [u64; 2] {
    let half = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    [half(&bytes[..8]), half(&bytes[8..])]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each part's length and bytes written one by one, as 0.7.0 hashed them: the
    /// identities of its saved snapshots.
    fn streamed(secret: [u64; 2], parts: &[&[u8]]) -> (u64, u64) {
        let mut h = SipHasher13::new_with_keys(secret[0], secret[1]);
        for part in parts {
            h.write(&(part.len() as u64).to_le_bytes());
            h.write(part);
        }
        let hash = h.finish128();
        (hash.h1, hash.h2)
    }

    #[test]
    fn one_write_hashes_as_the_parts_written_one_by_one() {
        let secret = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];
        let long = vec![b'k'; 300];
        // Before the key, 51 bytes of parts and lengths: a key of 77 bytes fills the buffer
        // whole, one of 78 is written beside it.
        let keys: [&[u8]; 6] = [b"", b"user 1", &long[..76], &long[..77], &long[..78], &long];
        for key in keys {
            let parts: [&[u8]; 4] = [b"memory key", &7u64.to_le_bytes(), &[1], key];
            let hash = keyed(secret, &parts).finish128();
            assert_eq!((hash.h1, hash.h2), streamed(secret, &parts), "a key of {} bytes", key.len());
        }
        // A limit's tag: 52 bytes before the name, so a name of 76 bytes fills the buffer whole.
        for name in [&long[..75], &long[..76], &long[..77]] {
            let parts: [&[u8]; 4] = [b"memory limit", &7u32.to_le_bytes(), &9u32.to_le_bytes(), name];
            assert_eq!(keyed(secret, &parts).finish(), streamed(secret, &parts).1, "a name of {} bytes", name.len());
        }
        // The key comes first or alone: the buffer is written before a part that does not fit.
        for parts in [[&long[..], b"x"], [b"x", &long[..]], [&long[..100], &long[..100]]] {
            let hash = keyed(secret, &parts).finish128();
            assert_eq!((hash.h1, hash.h2), streamed(secret, &parts));
        }
    }
}
