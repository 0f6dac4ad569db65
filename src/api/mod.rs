//! The SQL surface, split by concern, each entry a thin layer over what it calls:
//! `calls` the consuming calls and checks (raw fmgr entry points, for RL429), `admin` what
//! changes limits, blocks and state (SECURITY DEFINER), `headers` the
//! HTTP headers of a decision, `stats` the statistics views, `trigger` the cache trigger, `writes` the limits on a table's writes. This file holds what they share:
//! the checks of names, keys and counts, and finding a call's config.
//!
//! Every function is VOLATILE (it reads the clock and writes state) and PARALLEL UNSAFE (it
//! takes row locks and writes), except where its own file says otherwise.

use pgrx::pg_sys;

use crate::bucket::{Config, Kind, Mode};
use crate::cache;
use crate::call::{Request, MAX_KEY_BYTES, MAX_NAME_BYTES, MAX_REQUESTS, OTHER};
use crate::config::{self, JsonbArg};
use crate::error::{Error, Result};
use crate::limiter::Part;
use crate::overrides;
use crate::storage;

mod admin;
mod calls;
mod concurrency;
mod headers;
mod stats;
mod trigger;
mod writes;

/// The fmgr info of every raw entry point: version 1 calling convention.
static FMGR_V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };

/// The `pg_finfo_<symbol>` function PostgreSQL looks up beside a raw entry point's symbol.
macro_rules! fmgr_v1_info {
    ($info:ident) => {
        #[no_mangle]
        pub extern "C" fn $info() -> &'static pgrx::pg_sys::Pg_finfo_record {
            &super::FMGR_V1
        }
    };
}
use fmgr_v1_info;

/// Argument `n` of a call, of type text: read in place when it is stored plain (neither
/// compressed nor out of line) and ASCII, as names and keys nearly always are; else through
/// pgrx's conversion, which detoasts it (a guarded server call) and checks its encoding.
///
/// # Safety
/// `fcinfo` is a call whose argument `n` exists and is of type text.
unsafe fn text_arg<'a>(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<&'a str> {
    // SAFETY: argument `n` exists (the caller's promise); a non-null datum of type text
    // points at a varlena that lives as long as the call.
    unsafe {
        if pgrx::fcinfo::pg_arg_is_null(fcinfo, n) {
            return None;
        }
        let text = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, n).cast_mut_ptr::<pg_sys::varlena>();
        if !pgrx::varlena::varatt_is_1b_e(text) && !pgrx::varlena::varatt_is_4b_c(text) {
            let bytes = pgrx::varlena::varlena_to_byte_slice(text);
            if bytes.is_ascii() {
                return Some(std::str::from_utf8_unchecked(bytes));
            }
        }
        pgrx::fcinfo::pg_getarg::<&str>(fcinfo, n)
    }
}

fn valid_name(name: Option<&str>) -> Result<&str> {
    match name {
        None => Err(Error::InvalidArgument("name must not be NULL".into())),
        Some("") => Err(Error::InvalidArgument("name must not be empty".into())),
        Some(n) if n.len() > MAX_NAME_BYTES => Err(Error::InvalidArgument(format!(
            "name is {} bytes, more than {MAX_NAME_BYTES}",
            n.len()
        ))),
        // The statistics count names beyond their room under this one.
        Some(OTHER) => Err(Error::InvalidArgument(format!("the name {OTHER} is reserved"))),
        // What the state calls an inline config's rows: no name may read or reset them.
        Some(n) if storage::is_inline_name(n) => {
            Err(Error::InvalidArgument(format!("a name ending in '#' and 32 hex digits is reserved, not {n:?}")))
        }
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

pub(crate) fn request<'a>(
    name: Option<&'a str>,
    key: Option<&'a str>,
    count: Option<f64>,
    reserve: Option<bool>,
) -> Result<Request<'a>> {
    let count = count.ok_or_else(|| Error::InvalidArgument("count must not be NULL".into()))?;
    if !(count.is_finite() && count >= 0.0) {
        return Err(Error::InvalidArgument(format!("count must be a finite number >= 0, not {count}")));
    }
    if count > config::MAX_AMOUNT {
        return Err(Error::OutOfRange(format!("count must be at most {}, not {count}", config::MAX_AMOUNT)));
    }
    Ok(Request {
        name: valid_name(name)?,
        key: valid_key(key)?,
        count,
        reserve: reserve.unwrap_or(false),
        inline: None,
        exempt: false,
    })
}

/// The config `req` is judged under, with `req` marked with the state it reaches: an
/// inline config's own, by its fingerprint, or the named limit's; its numbers the key's
/// override's while one is in force.
fn resolve_for(req: &mut Request<'_>, inline: Option<JsonbArg>) -> Result<Config> {
    resolve(req, inline.map(|arg| arg.parse()).transpose()?.as_ref())
}

/// The call's config: `inline`'s, else its named limit's (a key's override's numbers in place
/// of either's while one is in force).
fn resolve(req: &mut Request<'_>, inline: Option<&serde_json::Value>) -> Result<Config> {
    match inline {
        Some(json) => inline_for(req, json),
        None => named_for(req),
    }
}

/// The named limit's config, its numbers the key's override's while one is in force.
fn named_for(req: &mut Request<'_>) -> Result<Config> {
    let named = resolve_named(req.name)?;
    overrides::config_for(req, named)
}

/// An inline config, `json`: counted by its own fingerprint, decided under the key's
/// override's numbers in place of its own while one is in force.
fn inline_for(req: &mut Request<'_>, json: &serde_json::Value) -> Result<Config> {
    let config = config::from_json(json)?;
    req.inline = Some(config::fingerprint(&config));
    overrides::inline_config_for(req, config, json)
}

fn resolve_named(name: &str) -> Result<Config> {
    cache::config(name, || {
        storage::load_limit(name)
            .ok_or_else(|| Error::UnknownLimit(name.to_owned()))
            .and_then(|row| Config::try_from(&row))
    })
}

/// Whether `config` can answer `req` at all.
pub(crate) fn usable(req: &Request<'_>, config: &Config) -> Result<()> {
    if config.kind == Kind::Concurrency {
        if req.reserve {
            return Err(Error::Concurrency("a concurrency limit has no reservations".into()));
        }
        if req.count.fract() != 0.0 {
            return Err(Error::InvalidArgument(format!(
                "a concurrency limit counts whole slots: count must be a whole number, not {}",
                req.count
            )));
        }
    }
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
        let mut req = request(name, key, count, Some(reserve))?;
        if !seen.insert((req.name, req.key)) {
            return Err(bad(format!("({}, {:?}) appears twice; add the counts instead", req.name, req.key)));
        }
        let config = match inline {
            Some(v) => inline_for(&mut req, v)?,
            None => named_for(&mut req)?,
        };
        if config.mode != Mode::All {
            return Err(Error::NotSupported(format!(
                "rate_limit_all takes all or nothing: \"{}\" has mode '{}'",
                req.name,
                config.mode.as_str()
            )));
        }
        if config.hot {
            // Its admission would have to be taken back when another part denies, and a hot
            // limit's log has nothing to take back from.
            return Err(Error::NotSupported(format!("rate_limit_all with the hot limit \"{}\"", req.name)));
        }
        if config.kind == Kind::Concurrency {
            // Its slots would have to be given back when another part denies.
            return Err(Error::Concurrency(format!("rate_limit_all with the concurrency limit \"{}\"", req.name)));
        }
        if !config.enforce {
            // All or nothing leaves no way to let one limit's denial through and take the others'.
            return Err(Error::NotSupported(format!("rate_limit_all with the shadow limit \"{}\"", req.name)));
        }
        usable(&req, &config)?;
        parts.push(Part { req, config });
    }
    Ok(parts)
}
