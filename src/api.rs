//! The SQL surface: thin functions that validate arguments, resolve the config and hand
//! over to the limiter.
//!
//! `rate_limit` and `check_rate_limit` are plain fmgr functions (declared in
//! `sql/finalize.sql`) rather than `#[pg_extern]`s, so that `throws => true` can raise the
//! custom SQLSTATE `RL429` (see `error::raise_rate_limited`). They need no SECURITY DEFINER:
//! `storage` reads and writes the state without SQL. Every function is VOLATILE (it reads
//! the clock and writes state) and PARALLEL UNSAFE (it takes row locks and writes).

use std::ffi::{c_char, CString};
use std::ptr::null_mut;
use std::time::Instant;

use pgrx::fcinfo::pg_getarg;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, Datum, FunctionCallInfo};
use pgrx::prelude::*;
use pgrx::JsonB;

use crate::bucket::{Config, Mode, Reason};
use crate::cache;
use crate::clock;
use crate::config::{self, JsonbArg, LimitRow};
use crate::deny_cache;
use crate::error::{self, Error, Result};
use crate::http;
use crate::limiter::{self, Decided, Decision, Part, Request};
use crate::stats;
use crate::shape;
use crate::storage::{self, StateTable};

pub const MAX_NAME_BYTES: usize = 128;
pub const MAX_KEY_BYTES: usize = 1024;
/// The most limits one `rate_limit_all` call may name: each is a row lock held to commit.
pub const MAX_REQUESTS: usize = 1000;

fn valid_name(name: Option<&str>) -> Result<&str> {
    match name {
        None => Err(Error::InvalidArgument("name must not be NULL".into())),
        Some("") => Err(Error::InvalidArgument("name must not be empty".into())),
        Some(n) if n.len() > MAX_NAME_BYTES => Err(Error::InvalidArgument(format!(
            "name is {} bytes, more than {MAX_NAME_BYTES}",
            n.len()
        ))),
        // The statistics count names beyond their room under this one.
        Some(stats::OTHER) => Err(Error::InvalidArgument(format!("the name {} is reserved", stats::OTHER))),
        Some(n) => Ok(n),
    }
}

fn valid_key(key: Option<&str>) -> Result<Option<&str>> {
    match key {
        Some(k) if k.len() > MAX_KEY_BYTES => Err(Error::InvalidArgument(format!(
            "key is {} bytes, more than {MAX_KEY_BYTES}; hash long keys first",
            k.len()
        ))),
        _ => Ok(key),
    }
}

fn request<'a>(
    name: Option<&'a str>,
    key: Option<&'a str>,
    count: Option<f64>,
    reserve: Option<bool>,
    inline: bool,
) -> Result<Request<'a>> {
    let count = count.ok_or_else(|| Error::InvalidArgument("count must not be NULL".into()))?;
    if !(count.is_finite() && count >= 0.0) {
        return Err(Error::InvalidArgument(format!("count must be a finite number >= 0, not {count}")));
    }
    Ok(Request {
        name: valid_name(name)?,
        key: valid_key(key)?,
        count,
        reserve: reserve.unwrap_or(false),
        inline,
    })
}

/// The inline config when given, else the named limit's (cached per backend).
fn resolve(name: &str, inline: Option<JsonbArg>) -> Result<Config> {
    match inline {
        Some(arg) => config::from_json(&arg.parse()?),
        None => resolve_named(name),
    }
}

fn resolve_named(name: &str) -> Result<Config> {
    cache::config(name, || {
        storage::load_limit(name)
            .ok_or_else(|| Error::UnknownLimit(name.to_owned()))
            .and_then(|row| Config::try_from(&row))
    })
}

/// Whether `config` can answer `req` at all.
fn usable(req: &Request<'_>, config: &Config) -> Result<()> {
    if req.reserve && !config.kind.can_reserve() {
        return Err(Error::NotSupported(format!("a {} has no reservations", config.kind.as_str())));
    }
    if req.reserve && config.mode != Mode::All {
        return Err(Error::NotSupported(format!("mode '{}' has no reservations", config.mode.as_str())));
    }
    match config.impossible_count(req.count, req.reserve) {
        Some(max) => Err(Error::CountExceedsMax { name: req.name.to_owned(), count: req.count, max }),
        None => Ok(()),
    }
}

fn decide(req: &Request<'_>, inline: Option<JsonbArg>, consume: bool) -> Result<Decision> {
    // Open the table first: its lock takes in pending invalidations of cached configs.
    let table = StateTable::open(consume.then_some(c"rate_limit()"));
    let config = resolve(req.name, inline)?;
    usable(req, &config)?;
    if let Some(d) = limiter::blocked(req) {
        return Ok(d);
    }
    if !consume {
        return Ok(limiter::check(&table, req, &config));
    }
    if let Some(d) = deny_cache::answer(req, &config) {
        return Ok(d);
    }
    let d = limiter::consume(&table, req, &config);
    deny_cache::remember(req, &config, &d);
    Ok(d)
}

/// A denial to raise as `RL429`: message, detail and hint, allocated by PostgreSQL (all
/// null when there is nothing to raise).
#[repr(C)]
#[derive(Clone, Copy)]
struct Denial {
    message: *mut c_char,
    detail: *mut c_char,
    hint: *mut c_char,
}

/// What a call returns to its fmgr entry point: only values with nothing to drop.
#[repr(C)]
#[derive(Clone, Copy)]
struct Answer {
    datum: Datum,
    throw: Denial,
}

fn pstrdup(text: &str) -> *mut c_char {
    let c = CString::new(text).unwrap_or_default();
    // SAFETY: copies a NUL-terminated text into the current memory context.
    unsafe { pg_sys::pstrdup(c.as_ptr()) }
}

/// The `RL429` of a decision that throws: a denial, or a reservation that must wait (as the
/// Convex component does); `None` otherwise.
fn denial(d: &Decision, name: &str, key: Option<&str>) -> Option<Denial> {
    if d.ok && d.retry_after.is_none() {
        return None;
    }
    let quoted = |s: Option<&str>| serde_json::Value::from(s).to_string();
    let retry_after = d.retry_after.map_or("null".to_owned(), |r| r.to_string());
    // Denials other than for want of tokens say why; the usual one keeps Convex's shape.
    let reason = match d.reason {
        Some(reason) if reason != Reason::Exhausted.as_str() => format!(r#","reason":"{reason}""#),
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
    Some(Denial {
        message: pstrdup(&format!("rate limit \"{name}\" exceeded")),
        detail: pstrdup(&detail),
        hint: pstrdup(&hint),
    })
}

const NO_DENIAL: Denial = Denial { message: null_mut(), detail: null_mut(), hint: null_mut() };

/// The body of `rate_limit` and `check_rate_limit`, guarded by pgrx: Rust panics and
/// PostgreSQL errors inside it are raised as errors with their own SQLSTATE.
///
/// # Safety
/// `fcinfo` is a call of `rate_limit` or `check_rate_limit`.
#[pg_guard]
unsafe extern "C-unwind" fn answer(fcinfo: FunctionCallInfo, consume: bool) -> Answer {
    // SAFETY: fmgr passes the six arguments declared in sql/finalize.sql, in this order.
    let (name, key, count, reserve, throws, inline) = unsafe {
        (
            pg_getarg::<&str>(fcinfo, 0),
            pg_getarg::<&str>(fcinfo, 1),
            pg_getarg::<f64>(fcinfo, 2),
            pg_getarg::<bool>(fcinfo, 3),
            pg_getarg::<bool>(fcinfo, 4),
            pg_getarg::<JsonbArg>(fcinfo, 5),
        )
    };
    let req = request(name, key, count, reserve, inline.is_some()).unwrap_or_else(|e| e.raise());
    let d = decide(&req, inline, consume).unwrap_or_else(|e| e.raise());
    if consume {
        stats::record(req.name, req.key, &d, true);
    }
    let datum = decision_datum(&d);
    let throw = match throws {
        Some(true) => denial(&d, req.name, req.key).unwrap_or(NO_DENIAL),
        _ => NO_DENIAL,
    };
    Answer { datum, throw }
}

/// The decision as a `rate_limiter.decision` datum; 55000 if that type was altered.
fn decision_datum(d: &Decision) -> Datum {
    let mut values = [
        Datum::from(d.ok),
        d.retry_after.map_or(Datum::from(0), |r| Datum::from(r.to_bits())),
        Datum::from(d.remaining.to_bits()),
        Datum::from(d.reset_after.to_bits()),
        Datum::from(d.granted.to_bits()),
        d.reason.into_datum().unwrap_or(Datum::from(0)),
        d.limited_by.as_deref().into_datum().unwrap_or(Datum::from(0)),
    ];
    let mut nulls = [false, d.retry_after.is_none(), false, false, false, d.reason.is_none(), d.limited_by.is_none()];
    // SAFETY: the type cache's descriptor, pinned until released below; it is read only
    // after checking it has exactly the columns `values` fills.
    unsafe {
        let desc = pg_sys::lookup_rowtype_tupdesc(cache::relations().decision_type, -1);
        if shape::difference(desc, &shape::DECISION, shape::Columns::Exactly).is_some() {
            pg_sys::DecrTupleDescRefCount(desc);
            Error::DecisionTypeChanged.raise()
        }
        let tuple = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::DecrTupleDescRefCount(desc);
        pgrx::heap_tuple_get_datum(tuple)
    }
}

/// Runs the guarded body, then raises `RL429` from this frame, which pgrx does not guard
/// and which holds nothing to drop: pgrx would turn a custom SQLSTATE into XX000.
fn entry(answer: Answer) -> Datum {
    let d = answer.throw;
    if !d.message.is_null() {
        // SAFETY: this frame holds nothing to drop; the texts were allocated by PostgreSQL.
        unsafe { error::raise_rate_limited(d.message, d.detail, d.hint) };
    }
    answer.datum
}

static FMGR_V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };

#[no_mangle]
pub extern "C" fn pg_finfo_rate_limit_fmgr() -> &'static pg_sys::Pg_finfo_record {
    &FMGR_V1
}

/// `rate_limiter.rate_limit(name, key, count, reserve, throws, config)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn rate_limit_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: fmgr calls this for rate_limiter.rate_limit only.
    entry(unsafe { answer(fcinfo, true) })
}

#[no_mangle]
pub extern "C" fn pg_finfo_check_rate_limit_fmgr() -> &'static pg_sys::Pg_finfo_record {
    &FMGR_V1
}

/// `rate_limiter.check_rate_limit(name, key, count, reserve, throws, config)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn check_rate_limit_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: fmgr calls this for rate_limiter.check_rate_limit only.
    entry(unsafe { answer(fcinfo, false) })
}

#[no_mangle]
pub extern "C" fn pg_finfo_wait_rate_limit_fmgr() -> &'static pg_sys::Pg_finfo_record {
    &FMGR_V1
}

/// `rate_limiter.wait_rate_limit(name, key, count, timeout, config)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn wait_rate_limit_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: fmgr calls this for rate_limiter.wait_rate_limit only.
    entry(unsafe { answer_wait(fcinfo) })
}

#[no_mangle]
pub extern "C" fn pg_finfo_rate_limit_all_fmgr() -> &'static pg_sys::Pg_finfo_record {
    &FMGR_V1
}

/// `rate_limiter.rate_limit_all(requests, reserve, throws)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn rate_limit_all_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: fmgr calls this for rate_limiter.rate_limit_all only.
    entry(unsafe { answer_all(fcinfo, true) })
}

#[no_mangle]
pub extern "C" fn pg_finfo_check_rate_limit_all_fmgr() -> &'static pg_sys::Pg_finfo_record {
    &FMGR_V1
}

/// `rate_limiter.check_rate_limit_all(requests, reserve, throws)`.
#[no_mangle]
pub unsafe extern "C-unwind" fn check_rate_limit_all_fmgr(fcinfo: FunctionCallInfo) -> Datum {
    // SAFETY: fmgr calls this for rate_limiter.check_rate_limit_all only.
    entry(unsafe { answer_all(fcinfo, false) })
}

/// The requests of `rate_limit_all`: a JSON array of `{"name", "key", "count", "config"}`.
fn parts(requests: &serde_json::Value, reserve: bool) -> Result<Vec<Part<'_>>> {
    let bad = |what: String| Error::InvalidArgument(format!("requests: {what}"));
    let list = requests.as_array().ok_or_else(|| bad(format!("expected a JSON array of objects, got {requests}")))?;
    if list.is_empty() {
        return Err(bad("name at least one limit".into()));
    }
    if list.len() > MAX_REQUESTS {
        return Err(bad(format!("{} limits, more than {MAX_REQUESTS}", list.len())));
    }
    let mut parts: Vec<Part<'_>> = Vec::with_capacity(list.len());
    let mut seen = std::collections::HashSet::with_capacity(list.len());
    for item in list {
        pgrx::check_for_interrupts!();
        let object = item.as_object().ok_or_else(|| bad(format!("expected an object, got {item}")))?;
        let (mut name, mut key, mut count, mut inline) = (None, None, Some(1.0), None);
        for (field, v) in object {
            let wrong = |expected: &str| bad(format!("\"{field}\" must be {expected}, got {v}"));
            match field.as_str() {
                "name" => name = Some(v.as_str().ok_or_else(|| wrong("a string"))?),
                "key" if v.is_null() => key = None,
                "key" => key = Some(v.as_str().ok_or_else(|| wrong("a string or null"))?),
                "count" => count = Some(v.as_f64().ok_or_else(|| wrong("a number"))?),
                "config" if v.is_null() => inline = None,
                "config" => inline = Some(v),
                other => return Err(bad(format!("unknown member \"{other}\" (known: name, key, count, config)"))),
            }
        }
        let req = request(name, key, count, Some(reserve), inline.is_some())?;
        if !seen.insert((req.name, req.key)) {
            return Err(bad(format!("({}, {:?}) appears twice; add the counts instead", req.name, req.key)));
        }
        let config = match inline {
            Some(v) => config::from_json(v)?,
            None => resolve_named(req.name)?,
        };
        if config.mode != Mode::All {
            return Err(Error::NotSupported(format!(
                "rate_limit_all takes all or nothing: \"{}\" has mode '{}'",
                req.name,
                config.mode.as_str()
            )));
        }
        usable(&req, &config)?;
        parts.push(Part { req, config });
    }
    Ok(parts)
}

/// The body of `wait_rate_limit`: `rate_limit` again after each `retry_after` until it is
/// granted or the next wait would pass `timeout` (real time, also under `fake_now`). Denied
/// calls hold no row lock, so nothing of this call is held while it sleeps.
///
/// # Safety
/// `fcinfo` is a call of `wait_rate_limit`.
#[pg_guard]
unsafe extern "C-unwind" fn answer_wait(fcinfo: FunctionCallInfo) -> Answer {
    // SAFETY: fmgr passes the five arguments declared in sql/finalize.sql, in this order.
    let (name, key, count, timeout, inline) = unsafe {
        (
            pg_getarg::<&str>(fcinfo, 0),
            pg_getarg::<&str>(fcinfo, 1),
            pg_getarg::<f64>(fcinfo, 2),
            pg_getarg::<Interval>(fcinfo, 3),
            pg_getarg::<JsonbArg>(fcinfo, 4),
        )
    };
    let d = (|| -> Result<Decision> {
        let req = request(name, key, count, None, inline.is_some())?;
        let timeout = timeout.map(clock::interval_ms).unwrap_or(f64::NAN);
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(Error::InvalidArgument(format!("timeout must be a finite interval >= 0, not {timeout} ms")));
        }
        let started = Instant::now();
        let mut waited = false;
        loop {
            let d = decide(&req, inline, true)?;
            let left = timeout - started.elapsed().as_secs_f64() * 1000.0;
            match d.retry_after {
                Some(retry_after) if !d.ok && retry_after <= left => {
                    clock::sleep_ms(retry_after);
                    waited = true;
                }
                _ if !d.ok && waited => return Ok(Decision { reason: Some(limiter::TIMEOUT), ..d }),
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
    // SAFETY: fmgr passes the three arguments declared in sql/finalize.sql, in this order.
    let (requests, reserve, throws) = unsafe {
        (pg_getarg::<JsonbArg>(fcinfo, 0), pg_getarg::<bool>(fcinfo, 1), pg_getarg::<bool>(fcinfo, 2))
    };
    let requests = requests
        .ok_or_else(|| Error::InvalidArgument("requests must not be NULL".into()))
        .and_then(|r| r.parse())
        .unwrap_or_else(|e| e.raise());
    // Open the table first: its lock takes in pending invalidations of cached configs.
    let table = StateTable::open(consume.then_some(c"rate_limit_all()"));
    let parts = parts(&requests, reserve.unwrap_or(false)).unwrap_or_else(|e| e.raise());
    let Decided { all: d, limiting, parts: decisions } = limiter::decide_all(&table, &parts, consume);
    drop(table);
    if consume {
        // A call counts under every limit it names: allowed with what each granted, or
        // denied under all, with the key in the sketch of the one that limited it.
        for (i, part) in parts.iter().enumerate() {
            let own = decisions.get(i).filter(|_| d.ok).unwrap_or(&d);
            stats::record(part.req.name, part.req.key, own, i == limiting);
        }
    }
    let datum = decision_datum(&d);
    let throw = match throws {
        Some(true) => denial(&d, parts[limiting].req.name, parts[limiting].req.key).unwrap_or(NO_DENIAL),
        _ => NO_DENIAL,
    };
    Answer { datum, throw }
}

/// Forget the state of (name, key), every shard.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn reset_rate_limit(name: Option<&str>, key: default!(Option<&str>, "NULL")) {
    storage::prevent_writes_unless_allowed(c"reset_rate_limit()");
    let name = valid_name(name).unwrap_or_else(|e| e.raise());
    storage::delete(name, key);
    deny_cache::forget_this_database();
}

/// Deny `name`'s `key` (every limit's when `name` is NULL) until `until`, with `note`.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn block(
    name: Option<&str>,
    key: Option<&str>,
    until: default!(Option<TimestampWithTimeZone>, "'infinity'"),
    note: default!(Option<&str>, "NULL"),
) {
    storage::prevent_writes_unless_allowed(c"block()");
    (|| -> Result<()> {
        let name = name.map(|n| valid_name(Some(n))).transpose()?;
        let key = valid_key(key)?;
        let until = until.ok_or_else(|| Error::InvalidArgument("until must not be NULL; use 'infinity'".into()))?;
        storage::upsert_block(name, key, until, note);
        Ok(())
    })()
    .unwrap_or_else(|e| e.raise())
}

/// Lift the block of (`name`, `key`); whether there was one.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn unblock(name: Option<&str>, key: Option<&str>) -> bool {
    storage::prevent_writes_unless_allowed(c"unblock()");
    storage::delete_block(name, key)
}

/// Delete up to `max_rows` rows of `rate_limiter.state` that hold what a fresh state would
/// (for named and inline limits alike), or belong to named limits that no longer exist,
/// and blocks that have ended; returns how many. Skips rows that running
/// transactions hold, so it never waits for them and can run beside calls and itself.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn prune(max_rows: default!(Option<i32>, 10000)) -> i64 {
    storage::prevent_writes_unless_allowed(c"prune()");
    match max_rows {
        Some(n) if n >= 0 => storage::prune(clock::now_ms(), n),
        other => Error::InvalidArgument(format!("max_rows must be >= 0, not {other:?}")).raise(),
    }
}

/// A `rate_limiter.decision` passed in (written out in each signature: pgrx reads the SQL
/// type from the macro there).
type DecisionRow<'a> = pgrx::composite_type!('a, "rate_limiter.decision");

/// What the HTTP headers need of a decision.
fn http_answer(d: &DecisionRow<'_>) -> Result<http::Answer> {
    let field = |name: &str| d.get_by_name::<f64>(name).map_err(|e| Error::InvalidArgument(format!("decision.{name}: {e}")));
    let ok = d.get_by_name::<bool>("ok").map_err(|e| Error::InvalidArgument(format!("decision.ok: {e}")))?;
    Ok(http::Answer {
        ok: ok.ok_or_else(|| Error::InvalidArgument("decision.ok must not be NULL".into()))?,
        retry_after: field("retry_after")?,
        remaining: field("remaining")?.unwrap_or(0.0),
        reset_after: field("reset_after")?.unwrap_or(0.0),
    })
}

fn http_json(policies: &[http::Policy<'_>], current: &str, d: &DecisionRow<'_>) -> Result<JsonB> {
    let headers = http::headers(policies, current, &http_answer(d)?).map_err(|name| {
        Error::InvalidArgument(format!("the name \"{name}\" is not printable ASCII, which an HTTP header cannot carry"))
    })?;
    Ok(JsonB(headers))
}

/// The rate-limit HTTP response headers for decision `d` of limit `name` (its named config,
/// or `config` inline), as a jsonb object of header name to value.
#[pg_extern(stable, parallel_restricted)]
fn http_headers<'a>(
    name: Option<&'a str>,
    d: Option<pgrx::composite_type!('a, "rate_limiter.decision")>,
    config: default!(Option<JsonbArg>, "NULL"),
) -> JsonB {
    (|| -> Result<JsonB> {
        let name = valid_name(name)?;
        let d = d.ok_or_else(|| Error::InvalidArgument("d must not be NULL".into()))?;
        let config = resolve(name, config)?;
        http_json(&[http::Policy { name, rate: config.rate, period: config.period }], name, &d)
    })()
    .unwrap_or_else(|e| e.raise())
}

/// The same for a decision of `rate_limit_all(requests)`: one policy per limit named, and
/// `RateLimit` for the limit that denied it, or else the first.
#[pg_extern(stable, parallel_restricted)]
fn http_headers_all<'a>(requests: Option<JsonbArg>, d: Option<pgrx::composite_type!('a, "rate_limiter.decision")>) -> JsonB {
    (|| -> Result<JsonB> {
        let requests = requests.ok_or_else(|| Error::InvalidArgument("requests must not be NULL".into()))?.parse()?;
        let d = d.ok_or_else(|| Error::InvalidArgument("d must not be NULL".into()))?;
        let parts = parts(&requests, false)?;
        let mut policies: Vec<http::Policy<'_>> = Vec::new();
        for p in &parts {
            if !policies.iter().any(|q| q.name == p.req.name) {
                policies.push(http::Policy { name: p.req.name, rate: p.config.rate, period: p.config.period });
            }
        }
        let limited_by = d.get_by_name::<String>("limited_by").ok().flatten();
        let current = limited_by.as_deref().unwrap_or(policies[0].name);
        http_json(&policies, current, &d)
    })()
    .unwrap_or_else(|e| e.raise())
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
        let req = request(name, key, Some(0.0), None, config.is_some())?;
        let sample = match sample_shards {
            Some(n) if n >= 1 => n as u32,
            other => {
                return Err(Error::InvalidArgument(format!("sample_shards must be >= 1, not {other:?}")))
            }
        };
        let table = StateTable::open(None);
        let mut config = resolve(req.name, config)?;
        let (state, shard) = limiter::value(&table, &req, &config, sample);
        drop(table);
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

/// Create or replace a named limit (an upsert into `rate_limiter.limits`). Its C symbol is
/// new in 0.3.0, which added arguments: 0.2.0's SQL names `define_wrapper` (see below).
#[pg_extern(name = "define", security_definer, volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::too_many_arguments)]
fn define_limit(
    name: Option<&str>,
    kind: Option<&str>,
    rate: Option<f64>,
    period: Option<Interval>,
    capacity: default!(Option<f64>, "NULL"),
    max_reserved: default!(Option<f64>, "NULL"),
    shards: default!(Option<i32>, 1),
    start: default!(Option<TimestampWithTimeZone>, "NULL"),
    min_gap: default!(Option<Interval>, "NULL"),
    mode: default!(Option<&str>, "'all'"),
    buckets: default!(Option<i32>, "NULL"),
    lock_timeout: default!(Option<Interval>, "NULL"),
    on_lock_timeout: default!(Option<&str>, "'deny'"),
    deny_cache: default!(Option<Interval>, "NULL"),
) {
    storage::prevent_writes_unless_allowed(c"define()");
    let result = (|| -> Result<()> {
        let name = valid_name(name)?;
        let required = |what: &str| Error::InvalidConfig(format!("{what} must not be NULL"));
        let row = LimitRow {
            kind: kind.ok_or_else(|| required("kind"))?.to_owned(),
            rate: rate.ok_or_else(|| required("rate"))?,
            period: period.ok_or_else(|| required("period"))?,
            capacity,
            max_reserved,
            shards: shards.ok_or_else(|| required("shards"))?,
            start,
            min_gap,
            mode: mode.ok_or_else(|| required("mode"))?.to_owned(),
            buckets,
            lock_timeout,
            on_lock_timeout: on_lock_timeout.ok_or_else(|| required("on_lock_timeout"))?.to_owned(),
            deny_cache,
        };
        // Validate here for a clear message; the table's CHECK constraints are the backstop.
        Config::try_from(&row)?;
        storage::upsert_limit(&row, name);
        Ok(())
    })();
    result.unwrap_or_else(|e| e.raise())
}

#[no_mangle]
pub extern "C" fn pg_finfo_decide_wrapper() -> &'static pg_sys::Pg_finfo_record {
    &FMGR_V1
}

/// 0.1.0's `_decide`: its SQL names this symbol, so a database still on 0.1.0 can load this
/// library (and be updated); a call says what to do.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn decide_wrapper(_fcinfo: FunctionCallInfo) -> Datum {
    error::Error::ExtensionOutdated.raise()
}

#[no_mangle]
pub extern "C" fn pg_finfo_define_wrapper() -> &'static pg_sys::Pg_finfo_record {
    &FMGR_V1
}

/// `define` of 0.1.0 and 0.2.0, which had fewer arguments: the same, for a database not yet
/// updated.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn define_wrapper(_fcinfo: FunctionCallInfo) -> Datum {
    error::Error::ExtensionOutdated.raise()
}

thread_local! {
    static TOLD_STATS_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Without the shared area: say once per session how to get statistics.
fn stats_available() -> bool {
    if stats::enabled() {
        return true;
    }
    if !TOLD_STATS_OFF.replace(true) {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "rate_limiter statistics are off: the library is not in shared_preload_libraries",
            "rate_limiter",
        )
        .set_hint("Add rate_limiter to shared_preload_libraries in postgresql.conf and restart the server.")
        .report(PgLogLevel::NOTICE);
    }
    false
}

fn timestamptz(pg_us: i64) -> TimestampWithTimeZone {
    clock::ms_timestamptz(clock::pg_us_to_ms(pg_us))
}

/// The rows of the view `rate_limiter.stats`.
// pgrx reads the column names from the name! macros, so the type stays spelled out here.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_restricted)]
fn _stats() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(calls, i64),
        name!(allowed, i64),
        name!(denied, i64),
        name!(tokens_granted, f64),
        name!(tokens_reserved, f64),
        name!(last_allowed_at, Option<TimestampWithTimeZone>),
        name!(last_denied_at, Option<TimestampWithTimeZone>),
        name!(stats_reset, TimestampWithTimeZone),
    ),
> {
    let rows = if stats_available() { stats::rows() } else { Vec::new() };
    TableIterator::new(rows.into_iter().map(|r| {
        (
            r.name,
            r.calls,
            r.allowed,
            r.denied,
            r.tokens_granted,
            r.tokens_reserved,
            r.last_allowed_at.map(timestamptz),
            r.last_denied_at.map(timestamptz),
            timestamptz(r.stats_reset),
        )
    }))
}

/// The rows of the view `rate_limiter.top_denied`.
#[pg_extern(volatile, parallel_restricted)]
fn _top_denied() -> TableIterator<
    'static,
    (name!(name, String), name!(key, Option<String>), name!(denied, i64), name!(approximate_error, i64)),
> {
    let sketches = if stats_available() { stats::top_denied() } else { Vec::new() };
    TableIterator::new(sketches.into_iter().flat_map(|(name, heavy)| {
        heavy.into_iter().map(move |h| (name.clone(), h.key, h.count as i64, h.error as i64))
    }))
}

/// Zero the statistics of limit `name`, or of every name when NULL; returns how many rows
/// of `rate_limiter.stats` were reset.
#[pg_extern(volatile, parallel_restricted)]
fn stats_reset(name: default!(Option<&str>, "NULL")) -> i64 {
    if stats_available() { stats::reset(name) } else { 0 }
}
