//! Memory limits' counts across a clean restart, as pg_stat_statements keeps its counters: the
//! postmaster writes every counted key to a file when it shuts down cleanly, and reads them
//! back when it makes shared memory again, then removes the file. After a crash (when the
//! file would be older than the counts) there is none, and the snapshot table is loaded
//! instead (`snapshot`).

use std::fs;
use std::io::Write;

use pgrx::pg_sys;

use super::record::{self, COUNTS};
use super::{partition_of, Entry, PARTITION};

const FILE: &str = "pg_stat/rate_limiter_memory.dat";
const MAGIC: &[u8; 8] = b"rlmem002";

/// database, name, expires, counts.
const RECORD: usize = 4 + 32 + 8 + COUNTS;

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
            let r = record::of(entry);
            out.extend_from_slice(&u32::from(entry.database).to_le_bytes());
            out.extend_from_slice(&r.name);
            out.extend_from_slice(&r.expires.to_le_bytes());
            out.extend_from_slice(&r.counts);
            saved += 1;
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
/// keys were loaded, and how many found no free entry of their partition; None when there
/// was no file (a crash, or the first start).
///
/// # Safety
/// `entries` points to `count` free entries that no other process uses yet.
pub unsafe fn load(entries: *mut Entry, count: usize) -> Option<(usize, usize)> {
    let bytes = fs::read(FILE).ok()?;
    let _ = fs::remove_file(FILE);
    if !bytes.starts_with(MAGIC) || !(bytes.len() - MAGIC.len()).is_multiple_of(RECORD) || count == 0 {
        return None;
    }
    let (mut loaded, mut dropped) = (0, 0);
    for r in bytes[MAGIC.len()..].chunks_exact(RECORD) {
        let database = pg_sys::Oid::from(u32::from_le_bytes(r[..4].try_into().expect("4 bytes")));
        let (name, rest) = r[4..].split_at(32);
        let (expires, counts) = rest.split_at(8);
        let expires = f64::from_le_bytes(expires.try_into().expect("8 bytes"));
        let id = record::identity(name, counts).expect("sizes of a record");
        let first = partition_of(&id, count) * PARTITION;
        // SAFETY: the caller's promise; the partition's entries are below the count.
        let Some(i) = (first..first + PARTITION).find(|i| unsafe { !(*entries.add(*i)).used }) else {
            dropped += 1;
            continue;
        };
        // SAFETY: as above.
        let entry = unsafe { &mut *entries.add(i) };
        record::install(entry, database, &id, counts, expires);
        // Newer than the snapshot table's row: written there at the worker's next round.
        entry.changes = entry.saved + 1;
        super::refresh(i);
        super::note_changed(first / PARTITION);
        loaded += 1;
    }
    Some((loaded, dropped))
}
