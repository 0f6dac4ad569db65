//! Parsing a limit's config: a `rate_limiter.limits` row, or an inline jsonb object (the
//! Convex object as it is, camelCase or snake_case, `period` in ms or as interval text).

use pgrx::prelude::*;
use serde_json::Value;

use crate::bucket::calendar::Unit;
use crate::bucket::{Calendar, Config, Kind, Mode, OnLockTimeout, DEFAULT_BUCKETS, MAX_BUCKETS};
use crate::clock;
use crate::error::{Error, Result};

use super::validate::{validate, MAX_SHARDS};
use super::zone::{self, NamedBy};

/// An inline config argument (SQL `jsonb`), parsed here rather than by pgrx's `JsonB`, which
/// panics (XX000) on numbers jsonb accepts but a double cannot hold, such as 1e400.
#[derive(Clone, Copy)]
pub struct JsonbArg(pg_sys::Datum);

impl FromDatum for JsonbArg {
    /// # Safety
    /// As `FromDatum`: unless `is_null`, `datum` is a jsonb datum of the current call.
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        (!is_null).then_some(JsonbArg(datum))
    }
}

// SAFETY: a jsonb argument of SQL type jsonb, never returned.
unsafe impl pgrx::pgrx_sql_entity_graph::metadata::SqlTranslatable for JsonbArg {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JsonbArg);
    const TYPE_ORIGIN: pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin =
        pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin::External;
    const ARGUMENT_SQL: std::result::Result<
        pgrx::pgrx_sql_entity_graph::metadata::SqlMappingRef,
        pgrx::pgrx_sql_entity_graph::metadata::ArgumentError,
    > = Ok(pgrx::pgrx_sql_entity_graph::metadata::SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: std::result::Result<
        pgrx::pgrx_sql_entity_graph::metadata::ReturnsRef,
        pgrx::pgrx_sql_entity_graph::metadata::ReturnsError,
    > = Err(pgrx::pgrx_sql_entity_graph::metadata::ReturnsError::Datum);
}

// SAFETY: read through `FromDatum` above, as pgrx reads its own datum types.
unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for JsonbArg {
    /// # Safety
    /// As `ArgAbi`: `arg` is a live argument of the current call, declared jsonb.
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        // SAFETY: pgrx's calling convention hands over a live argument.
        unsafe { arg.unbox_arg_using_from_datum() }.expect("the config argument is declared nullable")
    }

    /// # Safety
    /// As `unbox_arg_unchecked`.
    unsafe fn unbox_nullable_arg(arg: pgrx::callconv::Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        // SAFETY: as above.
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

/// The most bytes a jsonb argument may hold (a config, or `rate_limit_all`'s requests): it
/// becomes Rust values several times its size, whose allocation is not PostgreSQL's to refuse.
const MAX_JSONB_BYTES: usize = 1 << 20;

impl JsonbArg {
    pub fn parse(&self) -> Result<Value> {
        // SAFETY: the datum is a jsonb argument of the current call; its size is read from its
        // header (a toasted value's too) without detoasting it.
        let bytes = unsafe { pg_sys::toast_raw_datum_size(self.0) };
        if bytes > MAX_JSONB_BYTES {
            return Err(Error::InvalidArgument(format!("a jsonb argument of {bytes} bytes, more than {MAX_JSONB_BYTES}")));
        }
        // SAFETY: the datum is a jsonb argument of the current call; jsonb_out detoasts it.
        let text = unsafe { pgrx::direct_function_call::<&std::ffi::CStr>(pg_sys::jsonb_out, &[Some(self.0)]) }
            .expect("jsonb_out never returns NULL");
        serde_json::from_str(&text.to_string_lossy())
            .map_err(|e| Error::InvalidConfig(format!("the config holds a value a double precision cannot: {e}")))
    }
}

/// A `rate_limiter.limits` row as stored.
#[derive(Clone)]
pub struct LimitRow {
    pub kind: String,
    pub rate: f64,
    pub period: Interval,
    pub capacity: Option<f64>,
    pub max_reserved: Option<f64>,
    pub shards: i32,
    pub start: Option<TimestampWithTimeZone>,
    pub min_gap: Option<Interval>,
    pub mode: String,
    pub buckets: Option<i32>,
    pub lock_timeout: Option<Interval>,
    pub on_lock_timeout: String,
    pub deny_cache: Option<Interval>,
    pub hot: bool,
    pub enforce: bool,
    pub tz: Option<String>,
    pub durable: bool,
}

impl TryFrom<&LimitRow> for Config {
    type Error = Error;

    fn try_from(row: &LimitRow) -> Result<Config> {
        let shards = u32::try_from(row.shards)
            .map_err(|_| Error::InvalidConfig(format!("shards must be >= 1, not {}", row.shards)))?;
        let kind = parse_kind(&row.kind)?;
        let buckets = row.buckets.map(|b| buckets_number(f64::from(b))).transpose()?;
        let start = row.start.map(clock::timestamptz_ms);
        validate(Config {
            calendar: calendar(kind, Some(row.period), row.tz.as_deref(), start, NamedBy::Limit)?,
            kind,
            rate: row.rate,
            period: clock::interval_ms(row.period),
            capacity: row.capacity.unwrap_or(row.rate),
            max_reserved: row.max_reserved,
            shards,
            start,
            min_gap: row.min_gap.map(clock::interval_ms),
            mode: parse_mode(&row.mode)?,
            buckets: buckets_for(kind, buckets)?,
            lock_timeout: row.lock_timeout.map(clock::interval_ms),
            on_lock_timeout: parse_on_lock_timeout(&row.on_lock_timeout)?,
            deny_cache: row.deny_cache.map(clock::interval_ms),
            hot: row.hot,
            durable: row.durable,
            enforce: row.enforce,
            split: false,
        })
    }
}

/// Parse an inline config object.
pub fn from_json(value: &Value) -> Result<Config> {
    let object = value
        .as_object()
        .ok_or_else(|| Error::MalformedConfig(format!("expected a JSON object, got {value}")))?;
    let mut kind = None;
    let mut rate = None;
    let mut period = None;
    let mut capacity = None;
    let mut max_reserved = None;
    let mut shards = None;
    let mut start = None;
    let mut min_gap = None;
    let mut mode = None;
    let mut buckets = None;
    let mut lock_timeout = None;
    let mut on_lock_timeout = None;
    let mut deny_cache = None;
    let mut enforce = None;
    let mut durable = None;
    let mut tz = None;
    // The period as interval text, whose months and days say whether it is a calendar one.
    let mut period_interval = None;
    for (field, v) in object {
        match field.as_str() {
            "kind" => kind = Some(parse_kind(text_field(field, v)?)?),
            "rate" => rate = Some(number_field(field, v)?),
            "period" => {
                period_interval = v.as_str().map(clock::parse_interval);
                period = Some(duration_field(field, v)?)
            }
            "tz" => {
                tz = match v {
                    Value::Null => None,
                    Value::String(name) => Some(name.as_str()),
                    _ => return Err(wrong_type(field, "a time zone name", v)),
                }
            }
            "capacity" => capacity = optional(v, |v| number_field(field, v))?,
            "maxReserved" | "max_reserved" => max_reserved = optional(v, |v| number_field(field, v))?,
            "shards" => shards = optional(v, |v| shards_field(field, v))?,
            "start" => start = optional(v, |v| start_field(field, v))?,
            "minGap" | "min_gap" => min_gap = optional(v, |v| duration_field(field, v))?,
            "mode" => mode = optional(v, |v| parse_mode(text_field(field, v)?))?,
            "buckets" => buckets = optional(v, |v| buckets_number(number_field(field, v)?))?,
            "lockTimeout" | "lock_timeout" => lock_timeout = optional(v, |v| duration_field(field, v))?,
            "onLockTimeout" | "on_lock_timeout" => {
                on_lock_timeout = optional(v, |v| parse_on_lock_timeout(text_field(field, v)?))?
            }
            "denyCache" | "deny_cache" => deny_cache = optional(v, |v| duration_field(field, v))?,
            "enforce" => enforce = optional(v, |v| v.as_bool().ok_or_else(|| wrong_type(field, "a boolean", v)))?,
            // The escrow of a hot limit is found by a name every backend knows.
            "hot" if v == &Value::Bool(true) => {
                return Err(Error::NotSupported("hot with an inline config: define the limit by name".into()))
            }
            "hot" if v == &Value::Bool(false) || v.is_null() => {}
            "durable" => durable = optional(v, |v| v.as_bool().ok_or_else(|| wrong_type(field, "a boolean", v)))?,
            other => {
                return Err(Error::InvalidConfig(format!(
                    "unknown key \"{other}\" (known: kind, rate, period, capacity, maxReserved, shards, \
                     start, minGap, mode, buckets, lockTimeout, onLockTimeout, denyCache, hot, durable, enforce, tz)"
                )))
            }
        }
    }
    let missing = |what: &str| Error::InvalidConfig(format!("\"{what}\" is required"));
    let kind = kind.ok_or_else(|| missing("kind"))?;
    let rate = rate.ok_or_else(|| missing("rate"))?;
    validate(Config {
        kind,
        rate,
        period: period.ok_or_else(|| missing("period"))?,
        capacity: capacity.unwrap_or(rate),
        max_reserved,
        shards: shards.unwrap_or(1),
        start,
        min_gap,
        mode: mode.unwrap_or(Mode::All),
        buckets: buckets_for(kind, buckets)?,
        lock_timeout,
        on_lock_timeout: on_lock_timeout.unwrap_or(OnLockTimeout::Deny),
        deny_cache,
        hot: false,
        durable: durable.unwrap_or(true),
        enforce: enforce.unwrap_or(true),
        calendar: calendar(kind, period_interval, tz, start, NamedBy::Inline)?,
        split: false,
    })
}

/// The calendar of a fixed window whose period is whole months, one day or one week (in
/// `tz`, UTC when `None`), aligned to `start`; `None` for every other period. Months mean
/// nothing to the other kinds, which count fixed lengths: refused, as is a `tz` without a
/// calendar period, rather than read as 30 days.
fn calendar(kind: Kind, period: Option<Interval>, tz: Option<&str>, start: Option<f64>, by: NamedBy) -> Result<Option<Calendar>> {
    let months = period.is_some_and(|p| p.months() != 0);
    let unit = period.and_then(|p| Unit::of(p.months(), p.days(), p.micros()));
    let shown = |p: Option<Interval>| p.map_or_else(String::new, |p| format!(" '{}'", clock::interval_text(p)));
    match unit {
        Some(unit) if kind == Kind::FixedWindow => {
            let zone = zone::named(tz, by).map_err(|refused| {
                Error::Calendar(match refused {
                    zone::Refused::Unknown => format!("time zone \"{}\" is not one PostgreSQL knows", tz.unwrap_or_default()),
                    zone::Refused::TooManySpecs => format!(
                        "time zone \"{}\" is a POSIX-style spec, and this session's inline configs have named {} others",
                        tz.unwrap_or_default(),
                        zone::MAX_SPECS
                    ),
                })
            })?;
            Ok(Some(Calendar::new(unit, zone, start)))
        }
        _ if months && kind != Kind::FixedWindow => Err(Error::Calendar(format!(
            "a {} counts a fixed length, and a period of months{} has none",
            kind.as_str(),
            shown(period)
        ))),
        _ if months => Err(Error::Calendar(format!(
            "a calendar period is whole months, '1 day' or '1 week', not{}",
            shown(period)
        ))),
        _ if tz.is_some() => Err(Error::Calendar(format!(
            "tz is for a fixed window of whole months, '1 day' or '1 week', not a {} of{}",
            kind.as_str(),
            shown(period).trim_start()
        ))),
        _ => Ok(None),
    }
}

fn parse_kind(kind: &str) -> Result<Kind> {
    match kind {
        "token bucket" => Ok(Kind::TokenBucket),
        "fixed window" => Ok(Kind::FixedWindow),
        "sliding window" => Ok(Kind::SlidingWindow),
        "rolling window" => Ok(Kind::RollingWindow),
        "concurrency" => Ok(Kind::Concurrency),
        other => Err(Error::InvalidConfig(format!(
            "unknown kind \"{other}\" (expected \"token bucket\", \"fixed window\", \"sliding window\", \
             \"rolling window\" or \"concurrency\")"
        ))),
    }
}

fn buckets_number(n: f64) -> Result<u32> {
    if n.fract() != 0.0 || !(1.0..=f64::from(MAX_BUCKETS)).contains(&n) {
        return Err(Error::InvalidConfig(format!("buckets must be an integer between 1 and {MAX_BUCKETS}, not {n}")));
    }
    Ok(n as u32)
}

/// A rolling window's cells (the default when not given); the other kinds have none.
fn buckets_for(kind: Kind, buckets: Option<u32>) -> Result<u32> {
    match (kind, buckets) {
        (Kind::RollingWindow, b) => Ok(b.unwrap_or(DEFAULT_BUCKETS)),
        (_, None) => Ok(0),
        (_, Some(_)) => Err(Error::InvalidConfig("buckets applies only to a rolling window".into())),
    }
}

fn parse_on_lock_timeout(policy: &str) -> Result<OnLockTimeout> {
    match policy {
        "deny" => Ok(OnLockTimeout::Deny),
        "allow" => Ok(OnLockTimeout::Allow),
        other => Err(Error::InvalidConfig(format!("unknown on_lock_timeout \"{other}\" (expected \"deny\" or \"allow\")"))),
    }
}

fn parse_mode(mode: &str) -> Result<Mode> {
    match mode {
        "all" => Ok(Mode::All),
        "partial" => Ok(Mode::Partial),
        "penalize" => Ok(Mode::Penalize),
        other => Err(Error::InvalidConfig(format!(
            "unknown mode \"{other}\" (expected \"all\", \"partial\" or \"penalize\")"
        ))),
    }
}

fn optional<T>(v: &Value, parse: impl FnOnce(&Value) -> Result<T>) -> Result<Option<T>> {
    if v.is_null() {
        Ok(None)
    } else {
        parse(v).map(Some)
    }
}

fn wrong_type(field: &str, expected: &str, v: &Value) -> Error {
    Error::MalformedConfig(format!("\"{field}\" must be {expected}, got {v}"))
}

fn text_field<'v>(field: &str, v: &'v Value) -> Result<&'v str> {
    v.as_str().ok_or_else(|| wrong_type(field, "a string", v))
}

fn number_field(field: &str, v: &Value) -> Result<f64> {
    v.as_f64().ok_or_else(|| wrong_type(field, "a number", v))
}

fn shards_field(field: &str, v: &Value) -> Result<u32> {
    let n = number_field(field, v)?;
    if n.fract() != 0.0 || !(1.0..=f64::from(MAX_SHARDS)).contains(&n) {
        return Err(Error::InvalidConfig(format!(
            "shards must be an integer between 1 and {MAX_SHARDS}, not {n}"
        )));
    }
    Ok(n as u32)
}

/// `period`: milliseconds, or interval text such as "1 minute".
fn duration_field(field: &str, v: &Value) -> Result<f64> {
    match v {
        Value::String(text) => Ok(clock::interval_ms(clock::parse_interval(text))),
        _ => number_field(field, v).map_err(|_| wrong_type(field, "milliseconds or interval text", v)),
    }
}

/// `start`: milliseconds since the epoch, or timestamptz text.
fn start_field(field: &str, v: &Value) -> Result<f64> {
    match v {
        Value::String(text) => {
            let c = std::ffi::CString::new(text.as_str())
                .map_err(|_| wrong_type(field, "a timestamp", v))?;
            Ok(clock::timestamptz_ms(clock::parse_timestamptz(&c)))
        }
        _ => number_field(field, v).map_err(|_| wrong_type(field, "ms since the epoch or timestamptz text", v)),
    }
}
