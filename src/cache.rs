//! Per-backend caches: the OIDs of the extension's tables, indexes and row type, the
//! configs of named limits, and whether any block exists. A relcache invalidation of one of
//! those relations empties them. PostgreSQL sends one on DDL and DROP EXTENSION, and the
//! triggers on `rate_limiter.limits` and `rate_limiter.blocks` send one at every change to
//! them, delivered to each backend once the change commits.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CStr;

use pgrx::prelude::*;

use crate::bucket::Config;
use crate::error::Error;

#[derive(Clone, Copy)]
pub struct Relations {
    pub state: pg_sys::Oid,
    pub state_key: pg_sys::Oid,
    pub limits: pg_sys::Oid,
    pub limits_key: pg_sys::Oid,
    pub blocks: pg_sys::Oid,
    pub blocks_key: pg_sys::Oid,
    pub decision_type: pg_sys::Oid,
    decision: pg_sys::Oid,
}

thread_local! {
    static RELATIONS: Cell<Option<Relations>> = const { Cell::new(None) };
    static CONFIGS: RefCell<HashMap<String, Config>> = RefCell::new(HashMap::new());
    static ANY_BLOCKS: Cell<Option<bool>> = const { Cell::new(None) };
}

pub fn relations() -> Relations {
    RELATIONS.get().unwrap_or_else(|| {
        let found = look_up();
        RELATIONS.set(Some(found));
        found
    })
}

fn look_up() -> Relations {
    // SAFETY: catalog lookups by name; each raises an ERROR rather than return garbage.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"rate_limiter".as_ptr(), false);
        let oid = |name: &CStr| {
            let oid = pg_sys::get_relname_relid(name.as_ptr(), schema);
            if oid == pg_sys::InvalidOid {
                error!("rate_limiter.{} is missing; reinstall the extension", name.to_string_lossy());
            }
            oid
        };
        let decision = oid(c"decision");
        let state = oid(c"state");
        // The library can be newer than the extension's SQL in a database not yet updated:
        // 0.1.0 and 0.2.0 had no expires column.
        if pg_sys::get_attnum(state, c"expires".as_ptr()) == pg_sys::InvalidAttrNumber as i16 {
            Error::ExtensionOutdated.raise()
        }
        let state_key = oid(c"state_key_name_shard_key");
        Relations {
            state,
            state_key,
            limits: oid(c"limits"),
            limits_key: oid(c"limits_pkey"),
            blocks: oid(c"blocks"),
            blocks_key: oid(c"blocks_key_name_key"),
            decision_type: pg_sys::get_rel_type_id(decision),
            decision,
        }
    }
}

/// The named limit's config, from the cache or from `load` (which the cache then keeps).
pub fn config<E>(name: &str, load: impl FnOnce() -> Result<Config, E>) -> Result<Config, E> {
    if let Some(config) = CONFIGS.with_borrow(|configs| configs.get(name).copied()) {
        return Ok(config);
    }
    let config = load()?;
    CONFIGS.with_borrow_mut(|configs| configs.insert(name.to_owned(), config));
    Ok(config)
}

/// Whether `rate_limiter.blocks` has any row, from the cache or from `load`.
pub fn any_blocks(load: impl FnOnce() -> bool) -> bool {
    ANY_BLOCKS.get().unwrap_or_else(|| {
        let any = load();
        ANY_BLOCKS.set(Some(any));
        any
    })
}

/// The relcache invalidation callback: forgets this backend's caches when one of the
/// extension's relations (or everything) is invalidated. Reads nothing through pointers.
#[pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let ours = match RELATIONS.get() {
        Some(r) => [r.state, r.state_key, r.limits, r.limits_key, r.blocks, r.blocks_key, r.decision].contains(&relid),
        None => true,
    };
    if relid == pg_sys::InvalidOid || ours {
        RELATIONS.set(None);
        CONFIGS.with_borrow_mut(HashMap::clear);
        ANY_BLOCKS.set(None);
    }
}

/// Called once from `_PG_init`.
pub fn register_invalidation() {
    // SAFETY: registering a callback with static lifetime, once per backend.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(forget), pg_sys::Datum::from(0)) }
}

/// Trigger on `rate_limiter.limits` and `rate_limiter.blocks`: tell every backend to drop
/// its cached configs and block flag.
#[pg_trigger]
fn _limits_changed<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByRust>>, PgHeapTupleError> {
    let relid = trigger.relation().map(|r| r.oid()).unwrap_or(pg_sys::InvalidOid);
    // SAFETY: queues an invalidation of an existing relation, sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
    crate::deny_cache::forget_all();
    Ok(None)
}
