//! Limits on a table's writes, declared once (`limit_writes`, `unlimit_writes`), and the
//! trigger they make (`_write_limited`): each statement's rows charged per key, a call each
//! as `rate_limit(..., throws => true)` makes it, in the keys' order (so that two statements
//! never wait for each other's keys in a cycle); the first denial raises RL429 and fails the
//! statement, which gives back what its other keys took. Every limit a call takes works so
//! (hot, memory, shadow mode, overrides). Raw fmgr entry points, for `regclass` arguments and
//! for the RL429 (see `calls`).

use pgrx::fcinfo::pg_getarg;
use pgrx::pg_sys::{Datum, FunctionCallInfo};
use pgrx::prelude::*;
use serde_json::Value;

use crate::config::JsonbArg;
use crate::error::{Error, Result};
use crate::storage::write_limits::{self, Declared, Event};

use super::calls::{callable, entry, take_throwing, Answer, NO_DENIAL};
use super::{fmgr_v1_info, valid_name};

fmgr_v1_info!(pg_finfo_limit_writes_fmgr);

/// `rate_limiter.limit_writes(table, limit_name, key, events, count, config)`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.limit_writes` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn limit_writes_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of limit_writes.
    unsafe { limit_writes(fcinfo) }
}

/// Makes (or makes again) the limit's triggers on the table, one per event, dropping its
/// triggers for other events: what the call declares is what holds.
///
/// # Safety
/// `fcinfo` is a call of `limit_writes`.
#[pg_guard]
unsafe extern "C-unwind" fn limit_writes(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: the caller guarantees a call of limit_writes, whose SQL declaration has these six
    // argument types in this order.
    let (table, limit, key, events, count, config) = unsafe {
        (
            pg_getarg::<pg_sys::Oid>(fcinfo, 0),
            pg_getarg::<&str>(fcinfo, 1),
            pg_getarg::<&str>(fcinfo, 2),
            pg_getarg::<Vec<Option<String>>>(fcinfo, 3),
            pg_getarg::<&str>(fcinfo, 4),
            pg_getarg::<JsonbArg>(fcinfo, 5),
        )
    };
    declare(table, limit, key, events, count, config).unwrap_or_else(|e| e.raise());
    Datum::from(0)
}

fn declare(
    table: Option<pg_sys::Oid>,
    limit: Option<&str>,
    key: Option<&str>,
    events: Option<Vec<Option<String>>>,
    count: Option<&str>,
    config: Option<JsonbArg>,
) -> Result<()> {
    let table = table.ok_or_else(|| Error::InvalidArgument("table must not be NULL".into()))?;
    let limit = valid_name(limit)?;
    let mut parsed: Vec<Event> = Vec::new();
    for event in events.unwrap_or_default() {
        let event = Event::parse(event.as_deref().unwrap_or("NULL"))?;
        if !parsed.contains(&event) {
            parsed.push(event);
        }
    }
    if parsed.is_empty() {
        return Err(Error::InvalidArgument("events must name INSERT, UPDATE or DELETE".into()));
    }
    write_limits::lock_own_table(table)?;
    // Every writer's rows will be charged with the extension's rights: only a role that may
    // call the limit itself may have them charged.
    // SAFETY: reads the current user inside the transaction.
    if !write_limits::may_call_rate_limit(unsafe { pg_sys::GetUserId() }) {
        return Err(Error::WriteLimitDenied(format!(
            "{}: this role may not execute rate_limiter.rate_limit",
            crate::cache::qualified_name(table)
        )));
    }
    write_limits::no_other_trigger_rights(table)?;
    if let Some(key) = key {
        write_limits::key_column(table, key)?;
    }
    if let Some(count) = count {
        write_limits::count_column(table, count)?;
    }
    let config = config.map(|c| c.parse()).transpose()?;
    // The limit as the trigger will call it, checked now: named and defined, or inline.
    callable(limit, config.as_ref())?;
    let declared = Declared {
        limit: limit.to_owned(),
        key: key.map(str::to_owned),
        count: count.map(str::to_owned),
        config: config.map(|c| c.to_string()),
    };
    write_limits::drop_triggers(table, Some(limit));
    for event in parsed {
        write_limits::create_triggers(table, event, &declared)?;
    }
    Ok(())
}

fmgr_v1_info!(pg_finfo_unlimit_writes_fmgr);

/// `rate_limiter.unlimit_writes(table, limit_name)`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.unlimit_writes` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn unlimit_writes_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of unlimit_writes.
    unsafe { unlimit_writes(fcinfo) }
}

/// Drops the table's write limits (of the one limit, when named); how many triggers went.
///
/// # Safety
/// `fcinfo` is a call of `unlimit_writes`.
#[pg_guard]
unsafe extern "C-unwind" fn unlimit_writes(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: the caller guarantees a call of unlimit_writes, whose SQL declaration has these
    // two argument types in this order.
    let (table, limit) = unsafe { (pg_getarg::<pg_sys::Oid>(fcinfo, 0), pg_getarg::<&str>(fcinfo, 1)) };
    let dropped = (|| -> Result<i64> {
        let table = table.ok_or_else(|| Error::InvalidArgument("table must not be NULL".into()))?;
        write_limits::lock_own_table(table)?;
        Ok(write_limits::drop_triggers(table, limit))
    })()
    .unwrap_or_else(|e| e.raise());
    Datum::from(dropped as i32)
}

fmgr_v1_info!(pg_finfo_write_limited_fmgr);

/// `rate_limiter._write_limited()`, the trigger of a write limit.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter._write_limited` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn write_limited_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call by the function manager.
    entry(unsafe { charge_statement(fcinfo) })
}

/// Charges the statement's rows, per key; the RL429 of the first key the limit denies.
///
/// # Safety
/// `fcinfo` is a call of `_write_limited` by the function manager.
#[pg_guard]
unsafe extern "C-unwind" fn charge_statement(fcinfo: FunctionCallInfo) -> Answer {
    let none = Answer { datum: Datum::from(0), throw: NO_DENIAL };
    // SAFETY: the caller guarantees a call by the function manager.
    let fired = unsafe { write_limits::fired(fcinfo) }.unwrap_or_else(|e| e.raise());
    // In the keys' order, so that two statements never wait for each other's keys in a cycle.
    let charges = fired.charges().unwrap_or_else(|e| e.raise());
    if charges.is_empty() {
        return none;
    }
    let config: Option<Value> = fired.declared.config.as_deref().map(|c| {
        serde_json::from_str(c).unwrap_or_else(|e| Error::MalformedConfig(format!("a write limit's config: {e}")).raise())
    });
    for charge in &charges {
        let throw = take_throwing(&fired.declared.limit, charge.key.as_deref(), charge.count, config.as_ref());
        if throw.raises() {
            return Answer { datum: none.datum, throw };
        }
    }
    none
}
