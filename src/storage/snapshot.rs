//! `rate_limiter.memory_snapshot`: memory limits' counts as the background worker last wrote
//! them (`shmem::memory::snapshot`), read back after a crash or a promotion. A log: each
//! round appends rows of packed records, a reset or a dropped limit appends a row that
//! forgets, and a full copy now and then replaces everything before it. Nothing is updated
//! in place, so a round never waits for a row another transaction holds (F4 of issue 53).
//! Written once a round by the worker, read once per loss, so plain SQL through `spi`, as
//! the table's owner.

use pgrx::pg_sys;
use pgrx::IntoDatum;

use crate::cache;
use crate::clock;

use super::spi;

/// What a row of the log holds (its `kind`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// Every key of the database counted in memory, as of one round: what came before goes.
    Full,
    /// The keys a round found changed.
    Changed,
    /// A key's records, a limit's or all go (`Rows`).
    Forget,
    /// Keys were counted in rate_limiter.state for want of room (`mark_rows`).
    Rows,
}

impl Kind {
    const NAMES: [(Kind, &'static str); 4] = [(Kind::Full, "full"), (Kind::Changed, "changed"), (Kind::Forget, "forget"), (Kind::Rows, "rows")];

    fn name(self) -> &'static str {
        Kind::NAMES.iter().find(|(k, _)| *k == self).expect("every kind is named").1
    }

    fn of(name: &str) -> Option<Kind> {
        Kind::NAMES.iter().find(|(_, n)| *n == name).map(|(k, _)| *k)
    }
}

fn table() -> Option<pg_sys::Oid> {
    cache::relations().memory_snapshot
}

fn origin_arg(origin: i64) -> spi::Arg {
    (pg_sys::INT8OID, origin.into_datum())
}

/// Every row of `origin`'s log (this cluster's: `shmem::memory::snapshot_origin`), in the
/// order written: its kind and bytes.
pub fn read(origin: i64) -> Vec<(Kind, Vec<u8>)> {
    let Some(table) = table() else { return Vec::new() };
    let sql = format!(
        "SELECT kind, records FROM {} WHERE origin OPERATOR(pg_catalog.=) $1 ORDER BY seq",
        cache::qualified_name(table)
    );
    let mut rows = Vec::new();
    spi::run(table, &sql, &[origin_arg(origin)], |row| {
        if let Some(kind) = Kind::of(&row.text(1)) {
            rows.push((kind, row.bytea(2)));
        }
    });
    rows
}

/// How many records `origin`'s log holds: those of its full copy, and those written since.
pub fn size(origin: i64) -> (i64, i64) {
    let Some(table) = table() else { return (0, 0) };
    let sql = format!(
        "SELECT COALESCE(pg_catalog.sum(keys) FILTER (WHERE kind OPERATOR(pg_catalog.=) 'full'), 0), \
                COALESCE(pg_catalog.sum(keys) FILTER (WHERE kind OPERATOR(pg_catalog.<>) 'full'), 0) \
         FROM {} WHERE origin OPERATOR(pg_catalog.=) $1",
        cache::qualified_name(table)
    );
    let mut size = (0, 0);
    spi::run(table, &sql, &[origin_arg(origin)], |row| size = (row.int8(1), row.int8(2)));
    size
}

/// Rows appended by one statement: a round of millions of changed keys is written in
/// statements of bounded arrays.
const BATCH: usize = 1_000;

/// Append packed rows (bytes, keys, latest expiry in ms) to `origin`'s log, in a round that
/// `begin_round` began. A full copy then deletes every row of the log before it (a row
/// `prune` holds is left to it), but the mark of rows. False when there is no table (0.6.0's
/// is not one): nothing is written.
pub fn write(origin: i64, kind: Kind, rows: &[(&[u8], usize, f64)]) -> bool {
    let Some(table) = table() else { return false };
    let name = cache::qualified_name(table);
    let sql = format!(
        "INSERT INTO {name} (origin, kind, keys, records, expires, saved_at) \
         SELECT $5, $1, k, r, x, pg_catalog.clock_timestamp() \
         FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.bytea[]), \
                        pg_catalog.unnest($4::pg_catalog.timestamptz[])) AS u (k, r, x) \
         RETURNING seq"
    );
    let mut first = None;
    for batch in rows.chunks(BATCH) {
        let keys: Vec<i32> = batch.iter().map(|r| r.1 as i32).collect();
        let bytes: Vec<Vec<u8>> = batch.iter().map(|r| r.0.to_vec()).collect();
        let expires: Vec<_> = batch.iter().map(|r| clock::ms_timestamptz(r.2)).collect();
        let args = [
            spi::text_arg(kind.name()),
            (pg_sys::INT4ARRAYOID, keys.into_datum()),
            (pg_sys::BYTEAARRAYOID, bytes.into_datum()),
            (pg_sys::TIMESTAMPTZARRAYOID, expires.into_datum()),
            origin_arg(origin),
        ];
        spi::write(table, &sql, &args, |row| {
            let seq = row.int8(1);
            first = Some(first.map_or(seq, |f: i64| f.min(seq)));
        });
    }
    if let (Kind::Full, Some(first)) = (kind, first) {
        let sql = format!(
            "WITH before AS ( \
                 SELECT ctid FROM {name} \
                 WHERE origin OPERATOR(pg_catalog.=) $2 AND seq OPERATOR(pg_catalog.<) $1 AND kind OPERATOR(pg_catalog.<>) 'rows' \
                 FOR UPDATE SKIP LOCKED) \
             DELETE FROM {name} WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM before))"
        );
        spi::write(table, &sql, &[(pg_sys::INT8OID, first.into_datum()), origin_arg(origin)], |_| {});
    }
    true
}

/// Whose records `forget` drops.
pub enum Rows {
    /// One key's (its tag), under every config of its name.
    Key([u8; 16]),
    /// One limit's (its tag).
    Limit(u64),
    All,
}

impl Rows {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Rows::Key(key) => [&b"k"[..], key].concat(),
            Rows::Limit(limit) => [&b"l"[..], &limit.to_le_bytes()].concat(),
            Rows::All => b"a".to_vec(),
        }
    }

    /// What a forget row's bytes drop; None if they are of no known form.
    pub fn of(bytes: &[u8]) -> Option<Rows> {
        match bytes {
            [b'k', key @ ..] => Some(Rows::Key(key.try_into().ok()?)),
            [b'l', limit @ ..] => Some(Rows::Limit(u64::from_le_bytes(limit.try_into().ok()?))),
            [b'a'] => Some(Rows::All),
            _ => None,
        }
    }
}

/// Forget `rows` in the transaction that resets the key, deletes the limit or truncates the
/// limits: a crash after it commits loads none of their records written before it. (A
/// round that copied them before the change, and commits after, writes them again: a
/// crash before the next round then loads the counts before the change, never fewer.)
pub fn forget(origin: i64, rows: Rows) {
    let Some(table) = table() else { return };
    let sql = format!(
        "INSERT INTO {} (origin, kind, keys, records, expires, saved_at) \
         VALUES ($2, 'forget', 1, $1, 'infinity', pg_catalog.clock_timestamp())",
        cache::qualified_name(table)
    );
    spi::write(table, &sql, &[(pg_sys::BYTEAOID, rows.bytes().into_datum()), origin_arg(origin)], |_| {});
}

/// Mark, in the transaction that counts a key in a row, that this database's memory limits
/// counted keys in rate_limiter.state because they found no room in shared memory
/// (docs/memory-limits.md): after a restart, a key not in memory is then looked for there.
/// Committed with the row, or not at all; once per origin (a unique index).
pub fn mark_rows(origin: i64) {
    let Some(table) = table() else { return };
    let sql = format!(
        "INSERT INTO {} (origin, kind, keys, records, expires, saved_at) \
         VALUES ($1, 'rows', 0, '', 'infinity', pg_catalog.clock_timestamp()) \
         ON CONFLICT (origin) WHERE kind OPERATOR(pg_catalog.=) 'rows' DO NOTHING",
        cache::qualified_name(table)
    );
    spi::write(table, &sql, &[origin_arg(origin)], |_| {});
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

/// Whether `origin`'s mark is there (committed); so too where there is no log to mark (a
/// database still on 0.6.0's SQL): keys may have been counted in rows with no mark.
pub fn rows_marked(origin: i64) -> bool {
    let Some(table) = table() else { return true };
    let sql = format!(
        "SELECT 1 FROM {} WHERE origin OPERATOR(pg_catalog.=) $1 AND kind OPERATOR(pg_catalog.=) 'rows'",
        cache::qualified_name(table)
    );
    let mut marked = false;
    spi::run(table, &sql, &[origin_arg(origin)], |_| marked = true);
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
