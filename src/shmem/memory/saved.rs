//! Memory limits' counts across a clean restart, as pg_stat_statements keeps its counters: the
//! postmaster writes every counted key to a file when it shuts down cleanly, and reads them
//! back when it makes shared memory again, then removes the file. After a crash (when the
//! file would be older than the counts) there is none, and the snapshot table is loaded
//! instead (`snapshot`).

use std::fs;
use std::io::Write;

use pgrx::pg_sys;

use super::record::{self, COUNTS, NAME};
use super::{range, shares, Table};

const FILE: &str = "pg_stat/rate_limiter_memory.dat";
const MAGIC: &[u8; 8] = b"rlmem003";

/// database, name, expires, counts.
const RECORD: usize = 4 + NAME + 8 + COUNTS;

/// How the server shut down, as its control file says.
#[derive(Clone, Copy, PartialEq)]
pub enum Shutdown {
    /// An immediate shutdown or a crash: nothing is saved.
    Unclean,
    Primary,
    /// A standby's clean shutdown: its counts are its own calls', which only a standby
    /// started again may take on (`load`).
    Standby,
}

/// Whether the server shut down cleanly: its last checkpoint was a shutdown checkpoint, which
/// an immediate shutdown (a crash as far as the counts go) never writes; and as what.
pub fn shut_down_cleanly() -> Shutdown {
    let mut crc_ok = false;
    // SAFETY: DataDir is the data directory, set before shared memory is made; pg_control
    // always exists there, and is read into memory of the current context.
    let control = unsafe { pg_sys::get_controlfile(pg_sys::DataDir, &mut crc_ok) };
    // SAFETY: non-null (checked first): the ControlFileData just read.
    let state = if crc_ok && !control.is_null() { unsafe { (*control).state } } else { pg_sys::DBState::DB_IN_PRODUCTION };
    match state {
        pg_sys::DBState::DB_SHUTDOWNED => Shutdown::Primary,
        pg_sys::DBState::DB_SHUTDOWNED_IN_RECOVERY => Shutdown::Standby,
        _ => Shutdown::Unclean,
    }
}

/// Write the counted keys, when nothing is in flight.
///
/// # Safety
/// No other process uses the table any more.
pub unsafe fn save(table: &Table, shutdown: Shutdown) -> std::io::Result<usize> {
    let mut out = Vec::from(&MAGIC[..]);
    out.push(u8::from(shutdown == Shutdown::Standby));
    let mut saved = 0;
    for i in (0..table.partitions()).flat_map(|p| table.live(p)) {
        let entry = table.entry(i);
        if entry.used() && entry.database != 0 && entry.committed() {
            let r = record::of(table, entry);
            out.extend_from_slice(&entry.database.to_le_bytes());
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

/// Read the file back into the table (all free), and remove it; how many keys were loaded,
/// and how many found no free entry in their partitions; None when there was no file (a
/// crash, or the first start), one of another format (a library before 0.7.0, whose keys
/// this one cannot place), or a standby's while the server starts as a primary: a standby
/// promoted by a restart takes the primary's snapshot, not its own calls' counts (F2).
///
/// # Safety
/// In the postmaster, before any other process uses the table.
pub unsafe fn load(table: &Table, starts_in_recovery: bool) -> Option<(usize, usize)> {
    let bytes = fs::read(FILE).ok()?;
    let _ = fs::remove_file(FILE);
    let header = MAGIC.len() + 1;
    if !bytes.starts_with(MAGIC) || bytes.len() < header || !(bytes.len() - header).is_multiple_of(RECORD) {
        return None;
    }
    if bytes[MAGIC.len()] == 1 && !starts_in_recovery {
        pgrx::log!("rate_limiter: a standby's memory limit counts not loaded: the server starts as a primary, from the snapshot tables");
        return None;
    }
    let (mut loaded, mut dropped) = (0, 0);
    for r in bytes[header..].chunks_exact(RECORD) {
        let database = u32::from_le_bytes(r[..4].try_into().expect("4 bytes"));
        let (name, rest) = r[4..].split_at(NAME);
        let (expires, counts) = rest.split_at(8);
        let expires = f64::from_le_bytes(expires.try_into().expect("8 bytes"));
        let (id, config, state, base_at) = record::parse(name, counts).expect("sizes of a record");
        let partitions = id.partitions(table.partitions());
        let Some(i) = partitions.iter().flat_map(|p| range(*p)).find(|i| !table.entry(*i).used()) else {
            dropped += 1;
            continue;
        };
        table.entry(i).install(database, &id, config, state, base_at, expires);
        shares::add_at_start(table, database);
        // Newer than the snapshot table's row: written there at the worker's next round.
        table.entry_to_change(i);
        table.refresh(i);
        loaded += 1;
    }
    Some((loaded, dropped))
}
