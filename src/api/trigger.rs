//! The trigger on `rate_limiter.limits` and `rate_limiter.blocks` that tells every backend to
//! forget what it cached of them. (A file of its own: `#[pg_trigger]` names the standard
//! `Result`, which the other files of `api` shadow with the extension's.)

use pgrx::prelude::*;

use crate::shmem::deny_cache;

/// Trigger on `rate_limiter.limits` and `rate_limiter.blocks`: tell every backend to drop
/// its cached configs and block flag.
#[pg_trigger]
fn _limits_changed<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByRust>>, PgHeapTupleError> {
    let relid = trigger.relation().map(|r| r.oid()).unwrap_or(pg_sys::InvalidOid);
    // SAFETY: `relid` is the trigger's own relation, open and locked by the executor in this
    // transaction (InvalidOid would only raise "cache lookup failed"); the message is queued
    // and sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
    deny_cache::forget_this_database();
    Ok(None)
}
