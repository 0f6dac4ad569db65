//! The consuming calls and checks: `rate_limit`, `rate_limit_ok`, `check_rate_limit`,
//! `wait_rate_limit`, `rate_limit_all`, `check_rate_limit_all`, `credit` and `rate_limit_value`.
//!
//! The first seven are plain fmgr functions (declared in `sql/finalize.sql`) rather than
//! `#[pg_extern]`s, so that `throws => true` can raise the custom SQLSTATE `RL429` (see
//! `error::raise_rate_limited`). They need no SECURITY DEFINER: `storage` reads and writes
//! the state without SQL.

use std::ffi::{c_char, c_int, CString};
use std::ptr::null_mut;
use std::time::Instant;

use pgrx::fcinfo::pg_getarg;
use pgrx::pg_sys::{self, Datum, FunctionCallInfo};
use pgrx::prelude::*;
use pgrx::{JsonB, PgMemoryContexts};
use serde_json::json;

use crate::bucket::{self, Config, Kind};
use crate::call::Reason;
use crate::clock;
use crate::config::{self, JsonbArg};
use crate::error::{self, Error, Result};
use crate::http;
use crate::settings::{self, ThrowAs};
use crate::limiter::{self, Decided, Decision, Request};
use crate::shmem::{gate, stats};
use crate::storage::{self, decision_type};
use crate::storage::StateTable;

use super::{fmgr_v1_info, parts, request, resolve, resolve_for, text_arg, usable};


thread_local! {
    /// Whether this backend's last consuming call was a memory limit's (`decide`); before
    /// its first, as if it were (a durable-only backend guesses wrong once).
    static LAST_IN_MEMORY: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

fn decide(req: &mut Request<'_>, inline: Option<&serde_json::Value>, consume: bool) -> Result<(Decision, Config)> {
    if !consume {
        let table = StateTable::open(None);
        let config = resolve(req, inline)?;
        usable(req, &config)?;
        return Ok((limiter::decide(|| table, req, &config, false), config));
    }
    // The config is read once the call is held in, so that no change of the limit commits
    // under it: by the gate (shmem::gate), which a memory limit's call passes instead of the
    // table's lock unless a change is under way, or by the table's lock, which any other call
    // takes. Which one first is a guess from this backend's last call. A wrong guess costs
    // the gate, the lock, and the config read again after the lock: a change prepared
    // (PREPARE TRANSACTION) holds the lock but not the gate, and its invalidations come
    // only with COMMIT PREPARED. Invalidations are taken in after the gate, whose count of
    // changes goes only once theirs are sent.
    storage::prevent_in_parallel_mode(c"rate_limit()");
    let mut lock = if LAST_IN_MEMORY.get() && gate::enter() {
        StateTable::ready_for_call(c"rate_limit()");
        None
    } else {
        Some(StateTable::lock_for_call(c"rate_limit()"))
    };
    let mut config = resolve(req, inline)?;
    usable(req, &config)?;
    if lock.is_none() && !limiter::counted_in_memory(&config) {
        lock = Some(StateTable::lock_when_ready());
        req.exempt = false;
        config = resolve(req, inline)?;
        usable(req, &config)?;
    }
    LAST_IN_MEMORY.set(limiter::counted_in_memory(&config));
    let open_locked = || StateTable::open_after_call_lock(lock.unwrap_or_else(StateTable::lock_when_ready));
    // A durable limit's call is refused in a read-only transaction or on a standby before
    // anything else (25006); a memory limit's call writes nothing, and needs no more of the
    // table than the gate, unless its key is counted in a row (which opens it again).
    let table = config.durable.then(|| {
        let mut table = open_locked();
        table.prepare_writes(c"rate_limit()");
        table
    });
    let open = || table.unwrap_or_else(open_locked);
    Ok((limiter::decide(open, req, &config, consume), config))
}

/// The longest `wait_rate_limit` sleeps between tries of a concurrency limit: a slot frees
/// when its transaction ends, at no time a denial can tell.
const SLOT_POLL_MS: f64 = 10.0;

/// A denial to raise as `RL429`: message, detail and hint, allocated by PostgreSQL (all
/// null when there is nothing to raise).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Denial {
    code: c_int,
    message: *mut c_char,
    detail: *mut c_char,
    hint: *mut c_char,
}

/// What a call returns to its fmgr entry point: only values with nothing to drop.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Answer {
    pub(super) datum: Datum,
    pub(super) throw: Denial,
}

fn pstrdup(text: &str) -> *mut c_char {
    let c = CString::new(text).unwrap_or_default();
    // SAFETY: `c` is NUL-terminated and outlives the call; pstrdup copies it into the current
    // memory context and raises on out-of-memory rather than return NULL.
    unsafe { pg_sys::pstrdup(c.as_ptr()) }
}

/// The `RL429` of a decision that throws: a denial, or a reservation that must wait (as the
/// Convex component does); `None` otherwise.
pub(super) fn denial(d: &Decision, name: &str, key: Option<&str>, config: &Config) -> Option<Denial> {
    // An ok reservation that must wait raises, as Convex's does; a call shadow mode let
    // through does not.
    if d.ok && (d.retry_after.is_none() || d.reason == Some(Reason::Shadow)) {
        return None;
    }
    let quoted = |s: Option<&str>| serde_json::Value::from(s).to_string();
    let retry_after = d.retry_after.map_or("null".to_owned(), |r| r.to_string());
    // Denials other than for want of tokens say why; the usual one keeps Convex's shape.
    let reason = match d.reason {
        Some(reason) if reason != Reason::Exhausted => format!(r#","reason":"{}""#, reason.as_str()),
        _ => String::new(),
    };
    let detail = format!(
        r#"{{"kind":"RateLimited","name":{},"key":{},"retryAfter":{retry_after}{reason}}}"#,
        quoted(Some(name)),
        quoted(key)
    );
    let hint = match d.retry_after {
        Some(r) => format!("Retry after {r} ms."),
        None => "The key is blocked until further notice: see rate_limiter.blocks.".to_owned(),
    };
    let message = format!("rate limit \"{name}\" exceeded");
    let (code, message, detail) = match settings::THROW_AS.get() {
        ThrowAs::RL429 => (error::RL429, message, detail),
        ThrowAs::PT429 => (error::PT429, message, detail),
        ThrowAs::PGRST => {
            // PostgREST's own response: the body as PostgREST writes an error's, the status
            // and headers (Retry-After and draft 11's fields) in DETAIL.
            let body = json!({"code": "RL429", "message": message, "details": detail, "hint": hint});
            let policy = http::Policy { name, rate: config.rate, period: config.period, concurrent: config.kind == Kind::Concurrency, partition: None };
            let answer = http::Answer { ok: d.ok, retry_after: d.retry_after, remaining: d.remaining, reset_after: d.reset_after };
            // A name a header cannot carry: Retry-After alone, when there is a time to give.
            let headers = http::headers(&[policy], name, &answer, http::Draft::Eleven).unwrap_or_else(|_| match d.retry_after {
                Some(r) => json!({"Retry-After": http::seconds(r).to_string()}),
                None => json!({}),
            });
            (error::PGRST, body.to_string(), json!({"status": 429, "headers": headers}).to_string())
        }
    };
    Some(Denial { code, message: pstrdup(&message), detail: pstrdup(&detail), hint: pstrdup(&hint) })
}

impl Denial {
    pub(super) fn raises(&self) -> bool {
        !self.message.is_null()
    }
}

pub(super) const NO_DENIAL: Denial = Denial { code: 0, message: null_mut(), detail: null_mut(), hint: null_mut() };

/// What a call returns: the decision's row, or its `ok` alone (`rate_limit_ok`, which forms
/// no row and needs no field selection of it: an eighth of a memory call's instructions).
#[repr(C)]
#[derive(Clone, Copy, PartialEq)]
enum Returns {
    Decision,
    Ok,
}

/// The body of `rate_limit`, `rate_limit_ok` and `check_rate_limit`, guarded by pgrx: Rust
/// panics and PostgreSQL errors inside it are raised as errors with their own SQLSTATE.
///
/// # Safety
/// `fcinfo` is a call of `rate_limit`, `rate_limit_ok` or `check_rate_limit`.
#[pg_guard]
unsafe extern "C-unwind" fn answer(fcinfo: FunctionCallInfo, consume: bool, returns: Returns) -> Answer {
    // SAFETY: the caller guarantees a call of rate_limit, rate_limit_ok or check_rate_limit,
    // whose SQL declarations (sql/finalize.sql and the upgrade scripts alike) have these six
    // argument types in this order.
    let (name, key, count, reserve, throws, inline) = unsafe {
        (
            text_arg(fcinfo, 0),
            text_arg(fcinfo, 1),
            pg_getarg::<f64>(fcinfo, 2),
            pg_getarg::<bool>(fcinfo, 3),
            pg_getarg::<bool>(fcinfo, 4),
            pg_getarg::<JsonbArg>(fcinfo, 5),
        )
    };
    let mut req = request(name, key, count, reserve).unwrap_or_else(|e| e.raise());
    let inline = inline.map(|arg| arg.parse()).transpose().unwrap_or_else(|e| e.raise());
    let (d, config) = decide(&mut req, inline.as_ref(), consume).unwrap_or_else(|e| e.raise());
    if consume {
        stats::record(req.name, req.key, &d, true);
    }
    let datum = match returns {
        Returns::Decision => decision_datum(&d),
        Returns::Ok => Datum::from(d.ok),
    };
    let throw = match throws {
        Some(true) => denial(&d, req.name, req.key, &config).unwrap_or(NO_DENIAL),
        _ => NO_DENIAL,
    };
    Answer { datum, throw }
}

/// The columns of `rate_limiter.decision` (`shape::DECISION`) for `d`, and which are NULL.
pub(super) fn decision_columns(d: &Decision) -> ([Datum; 7], [bool; 7]) {
    let values = [
        Datum::from(d.ok),
        d.retry_after.map_or(Datum::from(0), |r| Datum::from(r.to_bits())),
        Datum::from(d.remaining.to_bits()),
        Datum::from(d.reset_after.to_bits()),
        Datum::from(d.granted.to_bits()),
        d.reason.map(Reason::as_str).into_datum().unwrap_or(Datum::from(0)),
        d.limited_by.as_deref().into_datum().unwrap_or(Datum::from(0)),
    ];
    let nulls = [false, d.retry_after.is_none(), false, false, false, d.reason.is_none(), d.limited_by.is_none()];
    (values, nulls)
}

/// The decision as a `rate_limiter.decision` datum; 55000 if that type was altered.
fn decision_datum(d: &Decision) -> Datum {
    let (mut values, mut nulls) = decision_columns(d);
    let desc = decision_type::descriptor();
    // SAFETY: the descriptor has exactly the columns `values` and `nulls` fill (checked by
    // `descriptor`), and nothing between its lookup and here takes invalidations in.
    unsafe { pgrx::heap_tuple_get_datum(pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr())) }
}

/// Runs the guarded body, then raises `RL429` from this frame, which pgrx does not guard
/// and which holds nothing to drop: pgrx would turn a custom SQLSTATE into XX000.
pub(super) fn entry(answer: Answer) -> Datum {
    let d = answer.throw;
    if !d.message.is_null() {
        // SAFETY: as raise_rate_limited requires, `entry` runs only in the unguarded fmgr entry
        // points below and holds only Copy values, so the longjmp skips no drop; `denial` made
        // all three texts with pstrdup, so they are NUL-terminated.
        unsafe { error::raise_rate_limited(d.code, d.message, d.detail, d.hint) };
    }
    answer.datum
}


fmgr_v1_info!(pg_finfo_rate_limit_fmgr);

/// `rate_limiter.rate_limit(name, key, count, reserve, throws, config)`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.rate_limit` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn rate_limit_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of rate_limit, as `answer`
    // requires (binding the symbol to other SQL takes a superuser).
    entry(unsafe { answer(fcinfo, true, Returns::Decision) })
}

fmgr_v1_info!(pg_finfo_rate_limit_ok_fmgr);

/// `rate_limiter.rate_limit_ok(name, key, count, reserve, throws, config)`: `rate_limit`'s
/// `ok`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.rate_limit_ok` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn rate_limit_ok_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of rate_limit_ok, as `answer`
    // requires (binding the symbol to other SQL takes a superuser).
    entry(unsafe { answer(fcinfo, true, Returns::Ok) })
}

fmgr_v1_info!(pg_finfo_check_rate_limit_fmgr);

/// `rate_limiter.check_rate_limit(name, key, count, reserve, throws, config)`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.check_rate_limit` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn check_rate_limit_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of check_rate_limit, as `answer`
    // requires (binding the symbol to other SQL takes a superuser).
    entry(unsafe { answer(fcinfo, false, Returns::Decision) })
}

fmgr_v1_info!(pg_finfo_wait_rate_limit_fmgr);

/// `rate_limiter.wait_rate_limit(name, key, count, timeout, config)`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.wait_rate_limit` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn wait_rate_limit_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of wait_rate_limit, as `answer_wait`
    // requires (binding the symbol to other SQL takes a superuser).
    entry(unsafe { answer_wait(fcinfo) })
}

fmgr_v1_info!(pg_finfo_rate_limit_all_fmgr);

/// `rate_limiter.rate_limit_all(requests, reserve, throws)`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.rate_limit_all` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn rate_limit_all_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of rate_limit_all, as `answer_all`
    // requires (binding the symbol to other SQL takes a superuser).
    entry(unsafe { answer_all(fcinfo, true) })
}

fmgr_v1_info!(pg_finfo_check_rate_limit_all_fmgr);

/// `rate_limiter.check_rate_limit_all(requests, reserve, throws)`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.check_rate_limit_all` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn check_rate_limit_all_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of check_rate_limit_all, as
    // `answer_all` requires (binding the symbol to other SQL takes a superuser).
    entry(unsafe { answer_all(fcinfo, false) })
}

fmgr_v1_info!(pg_finfo_credit_fmgr);

/// `rate_limiter.credit(name, key, count, config)`.
///
/// # Safety
/// Only for fmgr, calling `rate_limiter.credit` as sql/finalize.sql declares it.
#[no_mangle]
pub unsafe extern "C-unwind" fn credit_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: by this function's contract `fcinfo` is a call of credit, as `answer_credit`
    // requires (binding the symbol to other SQL takes a superuser).
    entry(unsafe { answer_credit(fcinfo) })
}

/// The body of `credit`: gives tokens back in the caller's transaction, whatever the lists
/// say (a give-back admits nothing by itself). Not counted in the statistics, which count
/// consuming calls.
///
/// # Safety
/// `fcinfo` is a call of `credit`.
#[pg_guard]
unsafe extern "C-unwind" fn answer_credit(fcinfo: FunctionCallInfo) -> Answer {
    // SAFETY: the caller guarantees a call of credit, whose SQL declaration has these four
    // argument types in this order.
    let (name, key, count, inline) = unsafe {
        (
            text_arg(fcinfo, 0),
            text_arg(fcinfo, 1),
            pg_getarg::<f64>(fcinfo, 2),
            pg_getarg::<JsonbArg>(fcinfo, 3),
        )
    };
    let d = (|| -> Result<Decision> {
        let mut req = request(name, key, count, None)?;
        // Open the table first: its lock takes in pending invalidations of cached configs.
        let mut table = StateTable::open_for_call(c"credit()");
        let config = resolve_for(&mut req, inline)?;
        if config.kind == Kind::Concurrency {
            return Err(Error::Concurrency(format!(
                "credit on the concurrency limit \"{}\": release() its lease; a transaction's slots end with it",
                req.name
            )));
        }
        if config.hot {
            // A give-back in flight would make the escrow more permissive, and its abort
            // would take that back from calls already admitted (a memory limit's escrow
            // counts it only once committed; a hot one's log could not).
            return Err(Error::NotSupported(format!("credit on the hot limit \"{}\"", req.name)));
        }
        if config.durable {
            table.prepare_writes(c"credit()");
        }
        Ok(limiter::credit(&table, &req, &config))
    })()
    .unwrap_or_else(|e| e.raise());
    Answer { datum: decision_datum(&d), throw: NO_DENIAL }
}

/// The body of `wait_rate_limit`: `rate_limit` again after each `retry_after` until it is
/// granted or the next wait would pass `timeout` (real time, also under `fake_now`). Denied
/// calls hold no row lock, so nothing of this call is held while it sleeps.
///
/// # Safety
/// `fcinfo` is a call of `wait_rate_limit`.
#[pg_guard]
unsafe extern "C-unwind" fn answer_wait(fcinfo: FunctionCallInfo) -> Answer {
    // SAFETY: the caller guarantees a call of wait_rate_limit, whose SQL declaration has these
    // five argument types in this order.
    let (name, key, count, timeout, inline) = unsafe {
        (
            text_arg(fcinfo, 0),
            text_arg(fcinfo, 1),
            pg_getarg::<f64>(fcinfo, 2),
            pg_getarg::<Interval>(fcinfo, 3),
            pg_getarg::<JsonbArg>(fcinfo, 4),
        )
    };
    let d = (|| -> Result<Decision> {
        let mut req = request(name, key, count, None)?;
        let timeout = timeout.map(clock::interval_ms).unwrap_or(f64::NAN);
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(Error::InvalidArgument(format!("timeout must be a finite interval >= 0, not {timeout} ms")));
        }
        let inline = inline.map(|arg| arg.parse()).transpose()?;
        let started = Instant::now();
        let mut waited = false;
        // Each try's server memory (its config read again, its table opened) in a context of
        // its own, emptied after it: a wait of any length holds one try's worth.
        let mut tries = PgMemoryContexts::new("wait_rate_limit tries");
        loop {
            // SAFETY: the decision and config are Rust values; nothing allocated in `tries` is
            // used after its reset below.
            let tried = unsafe { tries.switch_to(|_| decide(&mut req, inline.as_ref(), true)) };
            // SAFETY: as above.
            unsafe { tries.reset() };
            let (d, config) = tried?;
            let left = timeout - started.elapsed().as_secs_f64() * 1000.0;
            let poll = if config.kind == Kind::Concurrency { SLOT_POLL_MS } else { f64::INFINITY };
            match d.retry_after {
                Some(retry_after) if !d.ok && retry_after.min(poll) <= left => {
                    clock::sleep_ms(retry_after.min(poll));
                    waited = true;
                }
                _ if !d.ok && waited => return Ok(Decision { reason: Some(Reason::Timeout), ..d }),
                _ => return Ok(d),
            }
        }
    })()
    .unwrap_or_else(|e| e.raise());
    // Counted once, as its last try answered.
    stats::record(name.unwrap_or_default(), key, &d, true);
    Answer { datum: decision_datum(&d), throw: NO_DENIAL }
}

/// The body of `rate_limit_all` and `check_rate_limit_all`; see `answer`.
///
/// # Safety
/// `fcinfo` is a call of `rate_limit_all` or `check_rate_limit_all`.
#[pg_guard]
unsafe extern "C-unwind" fn answer_all(fcinfo: FunctionCallInfo, consume: bool) -> Answer {
    // SAFETY: the caller guarantees a call of rate_limit_all or check_rate_limit_all, whose SQL
    // declaration has these three argument types in this order.
    let (requests, reserve, throws) = unsafe {
        (pg_getarg::<JsonbArg>(fcinfo, 0), pg_getarg::<bool>(fcinfo, 1), pg_getarg::<bool>(fcinfo, 2))
    };
    let requests = requests
        .ok_or_else(|| Error::InvalidArgument("requests must not be NULL".into()))
        .and_then(|r| r.parse())
        .unwrap_or_else(|e| e.raise());
    // Open the table first: its lock takes in pending invalidations of cached configs. A
    // consuming call writes only if a part is durable: memory limits' parts alone answer in a
    // read-only transaction and on a standby, as rate_limit does.
    let mut table = if consume { StateTable::open_for_call(c"rate_limit_all()") } else { StateTable::open(None) };
    let mut parts = parts(&requests, reserve.unwrap_or(false)).unwrap_or_else(|e| e.raise());
    if consume {
        // A memory part whose key found no room in shared memory writes its row.
        limiter::place_memory_parts(&mut parts);
    }
    if consume && parts.iter().any(|p| p.config.durable) {
        table.prepare_writes(c"rate_limit_all()");
    }
    let Decided { all: d, limiting, parts: decisions } = limiter::decide_all(&table, &parts, consume);
    if consume {
        limiter::unpin_memory_parts();
    }
    drop(table);
    let denied = !d.ok;
    let d = d.shadowed(config::shadow_session());
    if consume {
        // A call counts under every limit it names: allowed with what each granted, or
        // denied (in shadow mode, shadow-denied) under all, with the key in the sketch of
        // the one that limited it; an allowed key's part is allowed whatever the others got.
        for (i, part) in parts.iter().enumerate() {
            let own = decisions.get(i).filter(|p| !denied || p.reason == Some(Reason::Allowed)).unwrap_or(&d);
            stats::record(part.req.name, part.req.key, own, i == limiting);
        }
    }
    let datum = decision_datum(&d);
    let throw = match throws {
        Some(true) => denial(&d, parts[limiting].req.name, parts[limiting].req.key, &parts[limiting].config).unwrap_or(NO_DENIAL),
        _ => NO_DENIAL,
    };
    Answer { datum, throw }
}

/// One key's share of a write limit's statement, taken as `rate_limit(name, key, count, throws
/// => true, config)` takes it, counted in the statistics: the RL429 to raise when it is denied.
pub(super) fn take_throwing(name: &str, key: Option<&str>, count: f64, inline: Option<&serde_json::Value>) -> Denial {
    let mut req = request(Some(name), key, Some(count), Some(false)).unwrap_or_else(|e| e.raise());
    let (d, config) = decide(&mut req, inline, true).unwrap_or_else(|e| e.raise());
    stats::record(req.name, req.key, &d, true);
    denial(&d, req.name, req.key, &config).unwrap_or(NO_DENIAL)
}

/// Whether a call of `name` (with `inline`, when given) could be made: the limit defined, the
/// config valid. What `limit_writes` checks before it makes its triggers.
pub(super) fn callable(name: &str, inline: Option<&serde_json::Value>) -> Result<()> {
    let mut req = request(Some(name), None, Some(0.0), Some(false))?;
    let config = resolve(&mut req, inline)?;
    usable(&req, &config)
}

/// The stored state of (name, key): the fullest of `sample_shards` random shards.
#[pg_extern(volatile, parallel_unsafe)]
fn rate_limit_value(
    name: Option<&str>,
    key: default!(Option<&str>, "NULL"),
    config: default!(Option<JsonbArg>, "NULL"),
    sample_shards: default!(Option<i32>, 1),
) -> TableIterator<
    'static,
    (
        name!(value, f64),
        name!(ts, TimestampWithTimeZone),
        name!(shard, i32),
        name!(effective_config, JsonB),
    ),
> {
    let row = (|| -> Result<_> {
        let mut req = request(name, key, Some(0.0), None)?;
        let sample = match sample_shards {
            Some(n) if n >= 1 => n as u32,
            other => {
                return Err(Error::InvalidArgument(format!("sample_shards must be >= 1, not {other:?}")))
            }
        };
        let table = StateTable::open(None);
        let mut config = resolve_for(&mut req, config)?;
        let (state, shard) = limiter::value(&table, &req, &config, sample);
        drop(table);
        // As a call reads it: a level written under other numbers keeps what was used.
        let state = bucket::as_read(&state, &config);
        if config.kind.has_windows() && config.start.is_none() {
            // As the Convex component does: report the window phase in force.
            config.start = Some(state.ts);
        }
        let effective = JsonB(config::to_json(&config));
        Ok((state.value, clock::ms_timestamptz(state.ts), shard, effective))
    })()
    .unwrap_or_else(|e| e.raise());
    TableIterator::once(row)
}
