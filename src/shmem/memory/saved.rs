//! Memory limits' counts across a clean restart, as pg_stat_statements keeps its counters: the
//! postmaster writes every counted key to a file when it shuts down cleanly, and reads them
//! back when it makes shared memory again, then removes the file, so that after a crash (when
//! the file would be older than the counts) every key starts full.

use std::fs;
use std::io::Write;

use pgrx::pg_sys;

use crate::bucket::escrow::{Escrow, Stored};

use super::{partition_of, Entry, Identity, Packed, PARTITION};

const FILE: &str = "pg_stat/rate_limiter_memory.dat";
const MAGIC: &[u8; 8] = b"rlmem001";

/// database, tag, limit, variant, config, expires, the packed base state, base_at.
const RECORD: usize = 4 + 16 * 4 + 8 + (8 * 4 + 1) + 8;

fn record(entry: &Entry) -> Option<Vec<u8>> {
    let (base, base_at) = entry.escrow.at_rest()?;
    let base = Packed::store(base);
    let mut r = Vec::with_capacity(RECORD);
    r.extend_from_slice(&u32::from(entry.database).to_le_bytes());
    for part in [&entry.id, &entry.limit, &entry.variant, &entry.config] {
        r.extend_from_slice(part);
    }
    r.extend_from_slice(&entry.expires.to_le_bytes());
    for v in [base.value, base.ts, base.counts[0], base.counts[1]] {
        r.extend_from_slice(&v.to_le_bytes());
    }
    r.push(base.len as u8);
    r.extend_from_slice(&base_at.to_le_bytes());
    Some(r)
}

/// Whether the server shut down cleanly: its last checkpoint was a shutdown checkpoint, which
/// an immediate shutdown (a crash as far as the counts go) never writes.
pub fn shut_down_cleanly() -> bool {
    let mut crc_ok = false;
    // SAFETY: DataDir is the data directory, set before shared memory is made; pg_control
    // always exists there, and is read into memory of the current context.
    let control = unsafe { pg_sys::get_controlfile(pg_sys::DataDir, &mut crc_ok) };
    // SAFETY: non-null (checked first): the ControlFileData just read.
    let state = if crc_ok && !control.is_null() { unsafe { (*control).state } } else { pg_sys::DBState::DB_IN_PRODUCTION };
    // A standby shut down cleanly says so too.
    matches!(state, pg_sys::DBState::DB_SHUTDOWNED | pg_sys::DBState::DB_SHUTDOWNED_IN_RECOVERY)
}

/// Write the counted keys of `entries` (`count` of them), when nothing is in flight.
///
/// # Safety
/// `entries` points to `count` entries that no other process uses any more.
pub unsafe fn save(entries: *mut Entry, count: usize) -> std::io::Result<usize> {
    let mut out = Vec::from(&MAGIC[..]);
    let mut saved = 0;
    for i in 0..count {
        // SAFETY: the caller's promise.
        let entry = unsafe { &*entries.add(i) };
        if entry.used && entry.database != pg_sys::InvalidOid && entry.committed {
            if let Some(r) = record(entry) {
                out.extend_from_slice(&r);
                saved += 1;
            }
        }
    }
    let tmp = format!("{FILE}.tmp");
    let mut file = fs::File::create(&tmp)?;
    file.write_all(&out)?;
    file.sync_all()?;
    fs::rename(tmp, FILE)?;
    Ok(saved)
}

/// Read the file back into `entries` (`count` of them, all free), and remove it; how many
/// keys were loaded, and how many found no free entry of their partition.
///
/// # Safety
/// `entries` points to `count` free entries that no other process uses yet.
pub unsafe fn load(entries: *mut Entry, count: usize) -> (usize, usize) {
    let Ok(bytes) = fs::read(FILE) else { return (0, 0) };
    let _ = fs::remove_file(FILE);
    if !bytes.starts_with(MAGIC) || !(bytes.len() - MAGIC.len()).is_multiple_of(RECORD) || count == 0 {
        return (0, 0);
    }
    let (mut loaded, mut dropped) = (0, 0);
    for r in bytes[MAGIC.len()..].chunks_exact(RECORD) {
        let mut at = 0;
        let mut take = |n: usize| {
            at += n;
            &r[at - n..at]
        };
        let database = pg_sys::Oid::from(u32::from_le_bytes(take(4).try_into().expect("4 bytes")));
        let tags: Vec<[u8; 16]> = (0..4).map(|_| take(16).try_into().expect("16 bytes")).collect();
        let mut number = || f64::from_le_bytes(take(8).try_into().expect("8 bytes"));
        let expires = number();
        let (value, ts, c0, c1) = (number(), number(), number(), number());
        let len = usize::from(take(1)[0]).min(2);
        let base_at = f64::from_le_bytes(take(8).try_into().expect("8 bytes"));
        let id = Identity { tag: tags[0], limit: tags[1], variant: tags[2] };
        let first = partition_of(&id, count) * PARTITION;
        // SAFETY: the caller's promise; the partition's entries are below the count.
        let free = (first..first + PARTITION).map(|i| unsafe { &mut *entries.add(i) }).find(|e| !e.used);
        let Some(entry) = free else {
            dropped += 1;
            continue;
        };
        entry.used = true;
        entry.database = database;
        entry.id = id.tag;
        entry.limit = id.limit;
        entry.variant = id.variant;
        entry.config = tags[3];
        entry.generation += 1;
        entry.expires = expires;
        entry.committed = true;
        let base = Packed { value, ts, counts: [c0, c1], len };
        // SAFETY: the entry's escrow, whose ring holds zeros.
        unsafe { Escrow::restart(&raw mut entry.escrow, base.load(), base_at) };
        loaded += 1;
    }
    (loaded, dropped)
}
