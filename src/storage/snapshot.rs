//! `rate_limiter.memory_snapshot`: memory limits' counts as the background worker last wrote
//! them (`shmem::memory::snapshot`), read back after a crash or a promotion. Written once a
//! round by the worker, read once per loss, so plain SQL through `spi`, as the table's owner.

use pgrx::pg_sys;
use pgrx::IntoDatum;

use crate::cache;
use crate::clock;

use super::spi;

/// One entry's row: its name, counts, and when they equal an absent key's (ms).
pub type Row = (Vec<u8>, Vec<u8>, f64);

fn table() -> Option<pg_sys::Oid> {
    cache::relations().memory_snapshot
}

/// Every row of the table.
pub fn read() -> Vec<Row> {
    let Some(table) = table() else { return Vec::new() };
    let sql = format!("SELECT entry, counts, expires FROM {}", cache::qualified_name(table));
    let mut rows = Vec::new();
    spi::run(table, &sql, &[], |row| rows.push((row.bytea(1), row.bytea(2), row.timestamptz(3))));
    rows
}

/// Rows written by one statement of a round: a round of millions of changed keys is written
/// in statements of bounded arrays.
const BATCH: usize = 50_000;

/// Write `rows` over the rows of the same entries, in a round `begin_round` began: a row
/// another transaction holds (a reset or a change of the limit deleting it) is skipped, not
/// waited for (F4 of issue 53). The positions of the rows skipped; None when there is no
/// table.
pub fn write(rows: &[(&[u8], &[u8], f64)]) -> Option<Vec<usize>> {
    let table = table()?;
    let mut skipped = Vec::new();
    for (b, batch) in rows.chunks(BATCH).enumerate() {
        skipped.extend(write_batch(table, batch).into_iter().map(|i| b * BATCH + i));
    }
    Some(skipped)
}

fn write_batch(table: pg_sys::Oid, rows: &[(&[u8], &[u8], f64)]) -> Vec<usize> {
    let name = cache::qualified_name(table);
    let entries = |sql: &str, of: Vec<Vec<u8>>| {
        let mut found = std::collections::HashSet::new();
        spi::write(table, sql, &[(pg_sys::BYTEAARRAYOID, of.into_datum())], |row| {
            found.insert(row.bytea(1));
        });
        found
    };
    // Rows another transaction may hold: an xmax set (a delete or a lock, in progress or
    // not). Only those are locked, skipping the ones held: a row lock is WAL of its own.
    let all: Vec<Vec<u8>> = rows.iter().map(|r| r.0.to_vec()).collect();
    let marked = entries(
        &format!("SELECT entry FROM {name} WHERE entry OPERATOR(pg_catalog.=) ANY ($1) AND xmax OPERATOR(pg_catalog.<>) '0'::pg_catalog.xid"),
        all,
    );
    let held: std::collections::HashSet<Vec<u8>> = if marked.is_empty() {
        marked
    } else {
        let locked = entries(
            &format!("SELECT entry FROM {name} WHERE entry OPERATOR(pg_catalog.=) ANY ($1) FOR UPDATE SKIP LOCKED"),
            marked.iter().cloned().collect(),
        );
        marked.difference(&locked).cloned().collect()
    };
    let skipped: Vec<usize> = (0..rows.len()).filter(|i| held.contains(rows[*i].0)).collect();
    let rows: Vec<&(&[u8], &[u8], f64)> = rows.iter().filter(|r| !held.contains(r.0)).collect();
    if rows.is_empty() {
        return skipped;
    }
    let sql = format!(
        "INSERT INTO {name} AS s (entry, counts, expires, saved_at) \
         SELECT e, c, x, pg_catalog.clock_timestamp() \
         FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.bytea[]), pg_catalog.unnest($2::pg_catalog.bytea[]), \
                        pg_catalog.unnest($3::pg_catalog.timestamptz[])) AS u (e, c, x) \
         ON CONFLICT (entry) DO UPDATE SET counts = excluded.counts, expires = excluded.expires, saved_at = excluded.saved_at"
    );
    let names: Vec<Vec<u8>> = rows.iter().map(|r| r.0.to_vec()).collect();
    let counts: Vec<Vec<u8>> = rows.iter().map(|r| r.1.to_vec()).collect();
    let expires: Vec<_> = rows.iter().map(|r| clock::ms_timestamptz(r.2)).collect();
    let args = [
        (pg_sys::BYTEAARRAYOID, names.into_datum()),
        (pg_sys::BYTEAARRAYOID, counts.into_datum()),
        (pg_sys::TIMESTAMPTZARRAYOID, expires.into_datum()),
    ];
    spi::write(table, &sql, &args, |_| {});
    skipped
}

/// Whose rows `forget` deletes.
pub enum Rows {
    /// One key's (its tag), under every config of its name.
    Key([u8; 16]),
    /// One limit's (its tag).
    Limit(u64),
    All,
}

/// Forget `rows` in the transaction that resets the key, deletes the limit or truncates the
/// limits: a crash after it commits loads none of them.
pub fn forget(rows: Rows) {
    let Some(table) = table() else { return };
    let name = cache::qualified_name(table);
    let bytes = |b: Vec<u8>| (pg_sys::BYTEAOID, b.into_datum());
    let (sql, args) = match rows {
        // The entry is the key's tag, then its variant's: a range of the primary key.
        Rows::Key(key) => (
            format!("DELETE FROM {name} WHERE entry OPERATOR(pg_catalog.>=) $1 AND entry OPERATOR(pg_catalog.<=) $2"),
            vec![bytes([&key[..], &[0u8; 8]].concat()), bytes([&key[..], &[0xffu8; 8]].concat())],
        ),
        Rows::Limit(limit) => (
            format!("DELETE FROM {name} WHERE pg_catalog.substring(counts, 1, 8) OPERATOR(pg_catalog.=) $1"),
            vec![bytes(limit.to_le_bytes().to_vec())],
        ),
        // The mark stays: the rows it stands for are rate_limiter.state's.
        Rows::All => (format!("DELETE FROM {name} WHERE entry OPERATOR(pg_catalog.<>) $1"), vec![bytes(ROWS_MARK.to_vec())]),
    };
    spi::write(table, &sql, &args, |_| {});
}

/// The row that says this database's memory limits counted keys in rate_limiter.state
/// because they found no room in shared memory (docs/memory-limits.md): after a restart,
/// a key not in memory is then looked for there. No entry's name is 4 bytes long.
const ROWS_MARK: &[u8] = b"rows";

/// Mark, in the transaction that counts a key in a row: committed with the row, or not at all.
pub fn mark_rows() {
    let Some(table) = table() else { return };
    let sql = format!(
        "INSERT INTO {} (entry, counts, expires, saved_at) VALUES ($1, '', 'infinity', pg_catalog.clock_timestamp()) \
         ON CONFLICT (entry) DO NOTHING",
        cache::qualified_name(table)
    );
    spi::write(table, &sql, &[(pg_sys::BYTEAOID, ROWS_MARK.to_vec().into_datum())], |_| {});
}

/// The (name, key) of every row of `rate_limiter.state` that a named memory limit counts a
/// key in (it found no room in shared memory): read at a promotion, whose standby counted
/// its own calls of those keys in its entries.
pub fn keys_in_rows() -> Vec<(String, Option<String>)> {
    let relations = cache::relations();
    let sql = format!(
        "SELECT s.name, s.key FROM {} s JOIN {} l ON l.name OPERATOR(pg_catalog.=) s.name \
         WHERE NOT l.durable AND s.shard OPERATOR(pg_catalog.=) 0",
        cache::qualified_name(relations.state),
        cache::qualified_name(relations.limits)
    );
    let mut keys = Vec::new();
    spi::run(relations.state, &sql, &[], |row| keys.push((row.text(1), row.text_or_null(2))));
    keys
}

/// Whether the mark is there (committed).
pub fn rows_marked() -> bool {
    let Some(table) = table() else { return false };
    let sql = format!("SELECT 1 FROM {} WHERE entry OPERATOR(pg_catalog.=) $1", cache::qualified_name(table));
    let mut marked = false;
    spi::run(table, &sql, &[(pg_sys::BYTEAOID, ROWS_MARK.to_vec().into_datum())], |_| marked = true);
    marked
}

/// A round of the snapshot, before it copies anything: one at a time in a database, until
/// its transaction ends (a lock on a sub-object of the extension that no command takes).
/// Two at once (a launcher restarted while its worker ran) could commit an older copy over
/// a newer one; false when another holds it, and this round does nothing.
pub fn begin_round() -> bool {
    // SAFETY: inside the worker's transaction; the extension exists (its table was found).
    // The lock is released at the transaction's end.
    unsafe {
        let extension = pg_sys::get_extension_oid(c"rate_limiter".as_ptr(), false);
        pg_sys::ConditionalLockDatabaseObject(pg_sys::ExtensionRelationId, extension, ROUND, pg_sys::ExclusiveLock as i32)
    }
}

/// This database's load of the table, one session at a time, until dropped: a lock on the
/// extension (a sub-object of it no command locks, so that nothing but another load waits).
pub struct LoadLock(pg_sys::Oid);

/// Sub-objects of the extension that no command locks (DROP EXTENSION locks 0): one for a
/// database's load of the table, one for a round of its snapshot.
const LOAD: u16 = 1;
const ROUND: u16 = 2;

impl LoadLock {

    pub fn take() -> LoadLock {
        // SAFETY: inside a transaction, as a call is; the extension exists (its tables were
        // found). A lock on an object tag, released on drop or at the transaction's end.
        unsafe {
            let extension = pg_sys::get_extension_oid(c"rate_limiter".as_ptr(), false);
            pg_sys::LockDatabaseObject(pg_sys::ExtensionRelationId, extension, LOAD, pg_sys::ExclusiveLock as i32);
            LoadLock(extension)
        }
    }
}

impl Drop for LoadLock {
    fn drop(&mut self) {
        // SAFETY: the lock `take` took, released once.
        unsafe { pg_sys::UnlockDatabaseObject(pg_sys::ExtensionRelationId, self.0, LOAD, pg_sys::ExclusiveLock as i32) }
    }
}
