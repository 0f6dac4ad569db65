//! `rate_limiter.leases`: the slots of concurrency limits held past the transaction that
//! took them, one row per (name, key, slot) until it expires (docs/semantics.md,
//! "Concurrency limits"). Rare beside the calls that read it, so plain SQL through SPI,
//! which keeps every index, constraint and publication informed, with two differences from
//! a caller's own statement:
//!
//! - every statement reads what is committed now (the latest snapshot, as foreign-key checks
//!   do), whatever the caller's isolation level: a call decides on the slots it has just
//!   locked, and a lease committed after its snapshot was taken holds one of them;
//! - it runs as the table's owner (as foreign-key checks do), since callers hold EXECUTE on
//!   the functions and no privilege on the table, whose lease ids are secrets.

use std::ffi::CString;

use pgrx::pg_sys::{self, Datum};
use pgrx::{FromDatum, IntoDatum};

use crate::cache;
use crate::error::Error;

use super::instant;
use super::row::{key_is_second_param_sql, named_or_inline_sql};

/// A lease's id: 16 random bytes, shown as a UUID.
pub type LeaseId = [u8; 16];

/// One leased slot as the table holds it.
#[derive(Clone, Copy, Debug)]
pub struct Leased {
    pub slot: u32,
    pub id: LeaseId,
    /// ms since the epoch.
    pub expires: f64,
}

fn table() -> String {
    match cache::relations().leases {
        Some(leases) => cache::qualified_name(leases),
        None => Error::ExtensionOutdated.raise(),
    }
}

/// Whether this database subscribes to `rate_limiter.leases`: its leases then arrive from
/// a publisher, whose slots this server never sees.
pub fn subscribed() -> bool {
    cache::relations().leases.is_some_and(super::subscribed)
}

/// The unexpired leases of (name, key) at `now`, in slot order.
pub fn unexpired(name: &str, key: Option<&str>, now: f64) -> Vec<Leased> {
    let sql = format!(
        "SELECT slot, lease_id, expires_at FROM {} \
         WHERE name OPERATOR(pg_catalog.=) $1 AND {} AND expires_at OPERATOR(pg_catalog.>) $3 ORDER BY slot",
        table(),
        key_is_second_param_sql(key)
    );
    let mut leased = Vec::new();
    run(&sql, &[text_arg(name), text_opt(key), ts_arg(now, "now")], |row| {
        leased.push(Leased { slot: row.int4(1) as u32, id: row.uuid(2), expires: row.timestamptz(3) });
    });
    leased
}

/// Lease `slots` of (name, key) as `id` until `expires`, in place of whatever expired lease
/// held them (the caller holds their locks and found none unexpired).
pub fn claim(name: &str, key: Option<&str>, slots: &[u32], id: &LeaseId, expires: f64) {
    let sql = format!(
        "INSERT INTO {} AS l (name, key, slot, lease_id, expires_at) \
         SELECT $1, $2, s, $3, $4 FROM pg_catalog.unnest($5::pg_catalog.int4[]) AS s \
         ON CONFLICT ON CONSTRAINT leases_name_key_slot_key DO UPDATE \
         SET lease_id = excluded.lease_id, expires_at = excluded.expires_at",
        table()
    );
    let slots: Vec<i32> = slots.iter().map(|s| *s as i32).collect();
    let array = (pg_sys::INT4ARRAYOID, slots.into_datum());
    run(&sql, &[text_arg(name), text_opt(key), uuid_arg(id), ts_arg(expires, "lease's end"), array], |_| {});
}

/// The name the lease `id` of (name, key) is stored under (an inline config's has its
/// fingerprint), if it is there.
pub fn lease_name(name: &str, key: Option<&str>, id: &LeaseId) -> Option<String> {
    let sql = format!(
        "SELECT name FROM {} WHERE {} AND {} AND lease_id OPERATOR(pg_catalog.=) $3 LIMIT 1",
        table(),
        named_or_inline_sql(""),
        key_is_second_param_sql(key)
    );
    let mut stored = None;
    run(&sql, &[text_arg(name), text_opt(key), uuid_arg(id)], |row| stored = Some(row.text(1)));
    stored
}

/// The slots the lease `id` of (stored name, key) holds unexpired at `now`.
pub fn of_lease(stored: &str, key: Option<&str>, id: &LeaseId, now: f64) -> Vec<Leased> {
    unexpired(stored, key, now).into_iter().filter(|l| l.id == *id).collect()
}

/// Delete the lease `id` of (name, key); whether it was still unexpired at `now`.
pub fn release(name: &str, key: Option<&str>, id: &LeaseId, now: f64) -> bool {
    let sql = format!(
        "DELETE FROM {} WHERE {} AND {} AND lease_id OPERATOR(pg_catalog.=) $3 \
         RETURNING expires_at OPERATOR(pg_catalog.>) $4",
        table(),
        named_or_inline_sql(""),
        key_is_second_param_sql(key)
    );
    let mut held = false;
    run(&sql, &[text_arg(name), text_opt(key), uuid_arg(id), ts_arg(now, "now")], |row| held |= row.bool(1));
    held
}

/// Move the end of the lease `id` of (name, key) to `expires` if it has not ended at `now`;
/// the slots it moved.
pub fn extend(name: &str, key: Option<&str>, id: &LeaseId, expires: f64, now: f64) -> usize {
    let sql = format!(
        "UPDATE {} SET expires_at = $4 WHERE name OPERATOR(pg_catalog.=) $1 AND {} \
         AND lease_id OPERATOR(pg_catalog.=) $3 AND expires_at OPERATOR(pg_catalog.>) $5 RETURNING slot",
        table(),
        key_is_second_param_sql(key)
    );
    let mut moved = 0;
    let args = [text_arg(name), text_opt(key), uuid_arg(id), ts_arg(expires, "lease's end"), ts_arg(now, "now")];
    run(&sql, &args, |_| moved += 1);
    moved
}

type Arg = (pg_sys::Oid, Option<Datum>);

fn text_arg(s: &str) -> Arg {
    (pg_sys::TEXTOID, s.into_datum())
}

fn text_opt(s: Option<&str>) -> Arg {
    (pg_sys::TEXTOID, s.and_then(|s| s.into_datum()))
}

fn ts_arg(ms: f64, what: &str) -> Arg {
    (pg_sys::TIMESTAMPTZOID, Some(instant(ms, what)))
}

fn uuid_arg(id: &LeaseId) -> Arg {
    (pg_sys::UUIDOID, pgrx::datum::Uuid::from_bytes(*id).into_datum())
}

/// One result row, read by column number (from 1).
struct ResultRow {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
}

impl ResultRow {
    fn datum(&self, column: i32) -> Datum {
        let mut is_null = false;
        // SAFETY: a row of SPI's current result and its descriptor, read while SPI is
        // connected; every column read here is NOT NULL in the table or computed non-null.
        let datum = unsafe { pg_sys::SPI_getbinval(self.tuple, self.desc, column, &mut is_null) };
        assert!(!is_null, "column {column} of a lease is never NULL");
        datum
    }

    fn int4(&self, column: i32) -> i32 {
        self.datum(column).value() as i32
    }

    fn bool(&self, column: i32) -> bool {
        self.datum(column).value() != 0
    }

    fn text(&self, column: i32) -> String {
        // SAFETY: a text datum of SPI's current result, read while SPI is connected.
        unsafe { String::from_datum(self.datum(column), false) }.expect("not NULL")
    }

    fn timestamptz(&self, column: i32) -> f64 {
        crate::clock::pg_us_to_ms(self.datum(column).value() as i64)
    }

    fn uuid(&self, column: i32) -> LeaseId {
        let ptr = self.datum(column).cast_mut_ptr::<u8>();
        let mut id = [0; 16];
        // SAFETY: a uuid datum points at its 16 bytes (pass by reference, fixed length).
        unsafe { std::ptr::copy_nonoverlapping(ptr, id.as_mut_ptr(), 16) };
        id
    }
}

/// Run `sql` with `args` ($1, $2, ... in order) as the table's owner, reading what is
/// committed now, and visit each row it returns.
fn run(sql: &str, args: &[Arg], mut each: impl FnMut(&ResultRow)) {
    let owner = cache::owner(cache::relations().leases.expect("checked by table()"));
    let _as_owner = AsOwner::switch(owner);
    let sql = CString::new(sql).expect("no NUL in the SQL");
    let mut types: Vec<pg_sys::Oid> = args.iter().map(|a| a.0).collect();
    let mut values: Vec<Datum> = args.iter().map(|a| a.1.unwrap_or(Datum::from(0))).collect();
    let nulls: Vec<std::ffi::c_char> = args.iter().map(|a| if a.1.is_some() { b' ' } else { b'n' } as std::ffi::c_char).collect();
    pgrx::spi::Spi::connect(|_| {
        // SAFETY: SPI is connected for this closure; the plan is freed before it returns (an
        // error frees it with SPI's memory); the latest snapshot is copied by SPI before it
        // runs the statement; the arrays hold one entry per argument.
        unsafe {
            let plan = pg_sys::SPI_prepare(sql.as_ptr(), args.len() as i32, types.as_mut_ptr());
            if plan.is_null() {
                let code = pg_sys::SPI_result;
                panic!("SPI_prepare failed ({code}): {}", sql.to_string_lossy());
            }
            let status = pg_sys::SPI_execute_snapshot(
                plan,
                values.as_mut_ptr(),
                nulls.as_ptr(),
                pg_sys::GetLatestSnapshot(),
                std::ptr::null_mut(),
                false,
                true,
                0,
            );
            if status < 0 {
                panic!("SPI_execute_snapshot failed ({status}): {}", sql.to_string_lossy());
            }
            let table = pg_sys::SPI_tuptable;
            if !table.is_null() {
                for i in 0..pg_sys::SPI_processed as usize {
                    each(&ResultRow { tuple: *(*table).vals.add(i), desc: (*table).tupdesc });
                }
            }
            pg_sys::SPI_freeplan(plan);
        }
    });
}

/// The current user switched to `owner` until dropped, as foreign-key checks switch to a
/// table's owner: row-level security of the owner's own table is not forced on it.
struct AsOwner {
    user: pg_sys::Oid,
    context: i32,
}

impl AsOwner {
    fn switch(owner: pg_sys::Oid) -> AsOwner {
        let (mut user, mut context) = (pg_sys::InvalidOid, 0);
        // SAFETY: reads and sets this backend's current user; restored on drop, and by the
        // (sub)transaction's abort on an error.
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
            let local = (pg_sys::SECURITY_LOCAL_USERID_CHANGE | pg_sys::SECURITY_NOFORCE_RLS) as i32;
            pg_sys::SetUserIdAndSecContext(owner, context | local);
        }
        AsOwner { user, context }
    }
}

impl Drop for AsOwner {
    fn drop(&mut self) {
        // SAFETY: gives back what `switch` read.
        unsafe { pg_sys::SetUserIdAndSecContext(self.user, self.context) }
    }
}
