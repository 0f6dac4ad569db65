//! `rate_limiter.leases`: the slots of concurrency limits held past the transaction that
//! took them, one row per (name, key, slot) until it expires (docs/semantics.md,
//! "Concurrency limits"). Rare beside the calls that read it, so plain SQL through `spi`,
//! which reads the latest snapshot (a call decides on the slots it has just locked, and a
//! lease committed after its snapshot was taken holds one of them) as the table's owner
//! (the lease ids are secrets).

use pgrx::pg_sys;
use pgrx::IntoDatum;

use crate::cache;
use crate::error::Error;

use super::spi;
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

fn leases() -> pg_sys::Oid {
    cache::relations().leases.unwrap_or_else(|| Error::ExtensionOutdated.raise())
}

fn table() -> String {
    cache::qualified_name(leases())
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
    spi::run(leases(), &sql, &[spi::text_arg(name), spi::text_opt(key), spi::ts_arg(now, "now")], |row| {
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
    spi::write(leases(), &sql, &[spi::text_arg(name), spi::text_opt(key), spi::uuid_arg(id), spi::ts_arg(expires, "lease's end"), array], |_| {});
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
    spi::run(leases(), &sql, &[spi::text_arg(name), spi::text_opt(key), spi::uuid_arg(id)], |row| stored = Some(row.text(1)));
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
    spi::write(leases(), &sql, &[spi::text_arg(name), spi::text_opt(key), spi::uuid_arg(id), spi::ts_arg(now, "now")], |row| held |= row.bool(1));
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
    let args = [spi::text_arg(name), spi::text_opt(key), spi::uuid_arg(id), spi::ts_arg(expires, "lease's end"), spi::ts_arg(now, "now")];
    spi::write(leases(), &sql, &args, |_| moved += 1);
    moved
}

