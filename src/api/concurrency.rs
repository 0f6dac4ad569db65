//! Concurrency limits' own calls: `acquire` (a raw fmgr function, for `throws`, as
//! `rate_limit` is), `release` and `renew`. `rate_limit`, `check_rate_limit`,
//! `wait_rate_limit` and `rate_limit_value` take a concurrency limit as they take any other.

use pgrx::fcinfo::pg_getarg;
use pgrx::pg_sys::{self, Datum, FunctionCallInfo};
use pgrx::prelude::*;

use crate::bucket::concurrency::MAX_LEASE_MS;
use crate::bucket::{Config, Kind};
use crate::clock;
use crate::config::{self, JsonbArg};
use crate::error::{Error, Result};
use crate::limiter::{self, concurrency::Hold, Decision, Request};
use crate::shmem::stats;
use crate::storage::leases::LeaseId;
use crate::storage::{shape, StateTable};

use super::calls::{decision_columns, denial, entry, Answer, NO_DENIAL};
use super::{fmgr_v1_info, request, resolve_for, usable, valid_key, valid_name};

/// 0A000 unless `config` is a concurrency limit's (what `acquire`, `release` and `renew` take).
fn concurrency_only(name: &str, config: &Config) -> Result<()> {
    match config.kind {
        Kind::Concurrency => Ok(()),
        kind => Err(Error::Concurrency(format!(
            "\"{name}\" is a {}, not a concurrency limit: call rate_limit() for it",
            kind.as_str()
        ))),
    }
}

/// A lease's length in ms: more than 0, at most `rate_limiter.max_lease` (and 100 years).
fn lease_ms(lease: Interval) -> Result<f64> {
    let ms = clock::interval_ms(lease);
    let most = MAX_LEASE_MS.min(config::max_lease_ms());
    if ms.is_finite() && ms > 0.0 && ms <= most {
        Ok(ms)
    } else {
        Err(Error::OutOfRange(format!(
            "a lease must be longer than 0 and at most rate_limiter.max_lease ({} s), not {ms} ms",
            most / 1000.0
        )))
    }
}

fmgr_v1_info!(pg_finfo_acquire_fmgr);

/// `rate_limiter.acquire(name, key, count, lease, throws, config)`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.acquire` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn acquire_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of acquire, as `answer_acquire`
    // requires (binding the symbol to other SQL takes a superuser).
    entry(unsafe { answer_acquire(fcinfo) })
}

/// The body of `acquire`, guarded by pgrx as `rate_limit`'s is.
///
/// # Safety
/// `fcinfo` is a call of `acquire`.
#[pg_guard]
unsafe extern "C-unwind" fn answer_acquire(fcinfo: FunctionCallInfo) -> Answer {
    // SAFETY: the caller guarantees a call of acquire, whose SQL declaration has these six
    // argument types in this order.
    let (name, key, count, lease, throws, inline) = unsafe {
        (
            pg_getarg::<&str>(fcinfo, 0),
            pg_getarg::<&str>(fcinfo, 1),
            pg_getarg::<f64>(fcinfo, 2),
            pg_getarg::<Interval>(fcinfo, 3),
            pg_getarg::<bool>(fcinfo, 4),
            pg_getarg::<JsonbArg>(fcinfo, 5),
        )
    };
    let (req, d, lease_id, config) = (|| -> Result<(Request<'_>, Decision, Option<LeaseId>, Config)> {
        let mut req = request(name, key, count, None)?;
        let hold = lease.map(lease_ms).transpose()?.map_or(Hold::Transaction, Hold::Lease);
        // Open the table first: its lock takes in pending invalidations of cached configs.
        let _table = StateTable::open(Some(c"acquire()"));
        let config = resolve_for(&mut req, inline)?;
        concurrency_only(req.name, &config)?;
        usable(&req, &config)?;
        let (d, lease_id) = limiter::acquire(&req, &config, hold);
        Ok((req, d, lease_id, config))
    })()
    .unwrap_or_else(|e| e.raise());
    stats::record(req.name, req.key, &d, true);
    // SAFETY: `fcinfo` is this call's, whose declaration returns the record of `ACQUIRED`.
    let datum = unsafe { acquired_datum(fcinfo, &d, lease_id.as_ref()) };
    let throw = match throws {
        Some(true) => denial(&d, req.name, req.key, &config).unwrap_or(NO_DENIAL),
        _ => NO_DENIAL,
    };
    Answer { datum, throw }
}

/// The decision and lease id as the record `acquire` returns; 55000 if its OUT arguments
/// were changed.
///
/// # Safety
/// `fcinfo` is a call of `acquire`.
unsafe fn acquired_datum(fcinfo: FunctionCallInfo, d: &Decision, lease_id: Option<&LeaseId>) -> Datum {
    let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
    // SAFETY: the caller's contract; get_call_result_type reads the function's declaration
    // into a descriptor in the current memory context, checked before use.
    unsafe {
        let kind = pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut desc);
        if kind != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE || desc.is_null() {
            let detail = "it must return the record of its OUT arguments".to_owned();
            Error::ShapeChanged { relation: "rate_limiter.acquire()".into(), detail }.raise()
        }
        shape::require(desc, "rate_limiter.acquire()", &shape::ACQUIRED, shape::Columns::Exactly);
        desc = pg_sys::BlessTupleDesc(desc);
    }
    let lease = lease_id.and_then(|id| pgrx::datum::Uuid::from_bytes(*id).into_datum());
    let (decision, decision_nulls) = decision_columns(d);
    let mut values = [decision.as_slice(), &[lease.unwrap_or(Datum::from(0))]].concat();
    let mut nulls = [decision_nulls.as_slice(), &[lease.is_none()]].concat();
    // SAFETY: the descriptor has exactly these columns (checked above).
    unsafe { pgrx::heap_tuple_get_datum(pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr())) }
}

/// End a lease of a concurrency limit before its time, in the caller's transaction: true
/// when it still held its slots, false when it had ended (expired, released, reset), was
/// never there, or is NULL. The lease is found by its id under (name, key), whatever config took it.
#[pg_extern(volatile, parallel_unsafe)]
fn release(name: Option<&str>, key: Option<&str>, lease_id: Option<pgrx::datum::Uuid>) -> bool {
    (|| -> Result<bool> {
        let Some((name, key, id)) = lease_call(name, key, lease_id)? else { return Ok(false) };
        let _table = StateTable::open(Some(c"release()"));
        Ok(limiter::concurrency::release(name, key, &id))
    })()
    .unwrap_or_else(|e| e.raise())
}

/// Move the end of a lease to `lease` from now, in the caller's transaction: true when it
/// was moved, false when the lease had ended (and its slots may be someone else's).
#[pg_extern(volatile, parallel_unsafe)]
fn renew(name: Option<&str>, key: Option<&str>, lease_id: Option<pgrx::datum::Uuid>, lease: Option<Interval>) -> bool {
    (|| -> Result<bool> {
        let ms = lease_ms(lease.ok_or_else(|| Error::InvalidArgument("lease must not be NULL".into()))?)?;
        let Some((name, key, id)) = lease_call(name, key, lease_id)? else { return Ok(false) };
        let _table = StateTable::open(Some(c"renew()"));
        Ok(limiter::concurrency::renew(name, key, &id, ms))
    })()
    .unwrap_or_else(|e| e.raise())
}

/// The checked arguments of `release` and `renew`; `None` for a NULL lease id, which the
/// calls answer false: an acquire that held nothing (shadow mode, an allowed key) gave none.
fn lease_call<'a>(
    name: Option<&'a str>,
    key: Option<&'a str>,
    lease_id: Option<pgrx::datum::Uuid>,
) -> Result<Option<(&'a str, Option<&'a str>, LeaseId)>> {
    let (name, key) = (valid_name(name)?, valid_key(key)?);
    Ok(lease_id.map(|id| {
        let mut bytes: LeaseId = [0; 16];
        bytes.copy_from_slice(id.as_bytes());
        (name, key, bytes)
    }))
}
