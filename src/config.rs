//! Limit configs: parsing a `rate_limiter.limits` row or an inline jsonb object (the Convex
//! object as it is, camelCase or snake_case, `period` in ms or as interval text), validating
//! it, rendering the effective config back as jsonb, and the fingerprint that keeps an
//! inline config's state apart from every other config's.

use pgrx::prelude::*;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::bucket::calendar::Unit;
use crate::bucket::{Calendar, Config, Kind, Mode, OnLockTimeout, DEFAULT_BUCKETS, MAX_BUCKETS};
use crate::call::Fingerprint;
use crate::clock;
use crate::error::{Error, Result};
use crate::settings::{self, MAX_SLOTS};

mod zone;

use zone::NamedBy;

/// More shards than this buys nothing and makes `reset_rate_limit` and sampling slow.
pub const MAX_SHARDS: u32 = 1024;

/// The most a rate, capacity, `maxReserved`, count or credit may be: below 2^53, whole
/// numbers of tokens stay exact in a double through every sum the kinds make.
pub const MAX_AMOUNT: f64 = 1e15;
/// The shortest period, and the narrowest cell of a rolling window: cells are whole
/// microseconds, and a window of no length divides by zero.
const MIN_PERIOD_MS: f64 = 1.0;
/// The longest period, `minGap` and `denyCache` (100 years): far enough that no real limit
/// needs more, near enough that every instant a kind computes from now stays within what
/// PostgreSQL and the kinds' microsecond cells can hold.
const MAX_DURATION_MS: f64 = 100.0 * 365.25 * 86_400_000.0;
/// The longest `lockTimeout`: PostgreSQL's own `lock_timeout` takes no more.
const MAX_LOCK_TIMEOUT_MS: f64 = i32::MAX as f64;

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

impl JsonbArg {
    pub fn parse(&self) -> Result<Value> {
        // SAFETY: the datum is a jsonb argument of the current call; jsonb_out detoasts it.
        let text = unsafe { pgrx::direct_function_call::<&std::ffi::CStr>(pg_sys::jsonb_out, &[Some(self.0)]) }
            .expect("jsonb_out never returns NULL");
        serde_json::from_str(&text.to_string_lossy())
            .map_err(|e| Error::InvalidConfig(format!("the config holds a value a double precision cannot: {e}")))
    }
}

/// A `rate_limiter.limits` row as stored.
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


/// `rate_limiter.max_lease`, in ms.
pub fn max_lease_ms() -> f64 {
    f64::from(settings::MAX_LEASE.get()) * 1000.0
}

/// `rate_limiter.max_slots_per_transaction`.
pub fn max_slots_per_transaction() -> u32 {
    settings::MAX_SLOTS_PER_TRANSACTION.get() as u32
}

/// Whether a call under `config` answers a denial in shadow mode: the limit's `enforce`
/// is off, or the session's `rate_limiter.shadow` on.
pub fn shadow(config: &Config) -> bool {
    !config.enforce || settings::SHADOW.get()
}

/// Whether the session is in shadow mode (`rate_limiter.shadow`).
pub fn shadow_session() -> bool {
    settings::SHADOW.get()
}

/// What identifies a config's arithmetic: SHA-256 (truncated to 128 bits, so no caller can
/// bring another config with the same fingerprint) of every field that shapes what the
/// state means or admits, with defaults filled in. Not `lockTimeout`, `onLockTimeout` or
/// `denyCache`, which say how a call waits or is answered, not what it may take: callers
/// that differ only in those share a state. Inline state is keyed by it (docs/semantics.md,
/// "Under another configuration").
pub fn fingerprint(config: &Config) -> Fingerprint {
    // `+ 0.0` makes -0 and 0 one number; NaN and infinities never pass `validate`.
    let number = |v: f64| (v + 0.0).to_bits().to_le_bytes();
    let optional = |v: Option<f64>| v.map_or([0xff; 9], |v| {
        let mut b = [0; 9];
        b[1..].copy_from_slice(&number(v));
        b
    });
    let mut hasher = Sha256::new();
    hasher.update(b"rate_limiter config 1\0");
    hasher.update(config.kind.as_str().as_bytes());
    hasher.update([0]);
    if config.kind == Kind::Concurrency {
        // Its slots are all it has; period only says when a denied call should come back.
        hasher.update(number(config.rate));
        return hasher.finalize()[..16].try_into().expect("16 bytes");
    }
    hasher.update(config.mode.as_str().as_bytes());
    hasher.update([0]);
    for v in [config.rate, config.period, config.capacity] {
        hasher.update(number(v));
    }
    for v in [config.max_reserved, config.start, config.min_gap] {
        hasher.update(optional(v));
    }
    hasher.update(config.shards.to_le_bytes());
    hasher.update(config.buckets.to_le_bytes());
    if let Some(c) = &config.calendar {
        let (unit, n) = match c.unit {
            Unit::Months(n) => (b'm', n),
            Unit::Days(n) => (b'd', n),
        };
        hasher.update([unit]);
        hasher.update(n.to_le_bytes());
        hasher.update(c.zone.name().as_bytes());
    }
    let digest = hasher.finalize();
    let mut fingerprint = [0; 16];
    fingerprint.copy_from_slice(&digest[..16]);
    fingerprint
}

/// The config in force with its defaults filled in, in the Convex shape (ms numbers), so it
/// can be passed back as an inline config.
pub fn to_json(config: &Config) -> Value {
    let mut object = Map::new();
    object.insert("kind".into(), config.kind.as_str().into());
    object.insert("rate".into(), number(config.rate));
    match config.calendar.map(|c| c.unit) {
        // As interval text, so that it is a calendar period when passed back.
        Some(Unit::Months(1)) => object.insert("period".into(), "1 month".into()),
        Some(Unit::Months(12)) => object.insert("period".into(), "1 year".into()),
        Some(Unit::Months(n)) if n % 12 == 0 => object.insert("period".into(), format!("{} years", n / 12).into()),
        Some(Unit::Months(n)) => object.insert("period".into(), format!("{n} months").into()),
        Some(Unit::Days(7)) => object.insert("period".into(), "1 week".into()),
        Some(Unit::Days(_)) => object.insert("period".into(), "1 day".into()),
        None => object.insert("period".into(), number(config.period)),
    };
    if let Some(c) = config.calendar.filter(|c| c.zone.name() != "UTC") {
        object.insert("tz".into(), c.zone.name().into());
    }
    object.insert("capacity".into(), number(config.capacity));
    if let Some(max_reserved) = config.max_reserved {
        object.insert("maxReserved".into(), number(max_reserved));
    }
    object.insert("shards".into(), config.shards.into());
    if let Some(start) = config.start {
        object.insert("start".into(), number(start));
    }
    if let Some(min_gap) = config.min_gap {
        object.insert("minGap".into(), number(min_gap));
    }
    object.insert("mode".into(), config.mode.as_str().into());
    if config.kind == Kind::RollingWindow {
        object.insert("buckets".into(), config.buckets.into());
    }
    if let Some(lock_timeout) = config.lock_timeout {
        object.insert("lockTimeout".into(), number(lock_timeout));
        object.insert("onLockTimeout".into(), config.on_lock_timeout.as_str().into());
    }
    if let Some(deny_cache) = config.deny_cache {
        object.insert("denyCache".into(), number(deny_cache));
    }
    if !config.enforce {
        object.insert("enforce".into(), false.into());
    }
    if !config.durable {
        object.insert("durable".into(), false.into());
    }
    Value::Object(object)
}

/// Whole numbers print as integers (60000, not 60000.0), as in the Convex object.
fn number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        Value::from(v as i64)
    } else {
        Value::from(v)
    }
}

fn validate(config: Config) -> Result<Config> {
    let positive = |what: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(Error::InvalidConfig(format!("{what} must be a finite number > 0, not {v}")))
        }
    };
    let non_negative = |what: &str, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(Error::InvalidConfig(format!("{what} must be a finite number >= 0, not {v}")))
        }
    };
    positive("rate", config.rate)?;
    positive("period", config.period)?;
    non_negative("capacity", config.capacity)?;
    if let Some(max_reserved) = config.max_reserved {
        non_negative("maxReserved", max_reserved)?;
    }
    within("rate", config.rate, 0.0, MAX_AMOUNT, "")?;
    within("capacity", config.capacity, 0.0, MAX_AMOUNT, "")?;
    within("maxReserved", config.max_reserved.unwrap_or(0.0), 0.0, MAX_AMOUNT, "")?;
    within("period", config.period, MIN_PERIOD_MS, MAX_DURATION_MS, " ms")?;
    if config.kind == Kind::RollingWindow {
        let cell = config.period / f64::from(config.buckets.max(1));
        within("a rolling window's cell (period / buckets)", cell, MIN_PERIOD_MS, MAX_DURATION_MS, " ms")?;
    }
    within("minGap", config.min_gap.unwrap_or(0.0), 0.0, MAX_DURATION_MS, " ms")?;
    within("denyCache", config.deny_cache.unwrap_or(0.0), 0.0, MAX_DURATION_MS, " ms")?;
    within("lockTimeout", config.lock_timeout.unwrap_or(0.0), 0.0, MAX_LOCK_TIMEOUT_MS, " ms")?;
    if !(1..=MAX_SHARDS).contains(&config.shards) {
        return Err(Error::InvalidConfig(format!(
            "shards must be between 1 and {MAX_SHARDS}, not {}",
            config.shards
        )));
    }
    if let Some(min_gap) = config.min_gap {
        non_negative("minGap", min_gap)?;
    }
    if let Some(lock_timeout) = config.lock_timeout {
        non_negative("lockTimeout", lock_timeout)?;
    }
    if let Some(deny_cache) = config.deny_cache {
        non_negative("denyCache", deny_cache)?;
        // A cached denial skips what a denial does besides denying: counting it (penalize)
        // or granting what is left (partial).
        if config.mode != Mode::All {
            return Err(Error::NotSupported(format!("denyCache with mode '{}'", config.mode.as_str())));
        }
    }
    // Settings that need one row per key: a sharded call spreads a key over rows (and may
    // hold one shard when it gives up on another).
    let per_key = [
        config.min_gap.map(|_| "minGap".to_owned()),
        (config.mode != Mode::All).then(|| format!("mode '{}'", config.mode.as_str())),
        config.lock_timeout.map(|_| "lockTimeout".to_owned()),
        config.deny_cache.map(|_| "denyCache".to_owned()),
    ];
    if let Some(setting) = per_key.into_iter().flatten().next().filter(|_| config.shards > 1) {
        return Err(Error::NotSupported(format!("{setting} needs one row per key: use shards = 1")));
    }
    // What the escrow's argument covers (docs/hot-limits.md): one row, mode 'all', no min_gap,
    // and calls that never wait for a row.
    if config.hot {
        let uncovered = [
            (config.shards > 1).then(|| "shards > 1 (a hot limit replaces sharding)".to_owned()),
            config.min_gap.map(|_| "minGap (an abort of the last granted call would make a refusal wrong)".to_owned()),
            (config.mode != Mode::All).then(|| format!("mode '{}' (it writes on denial)", config.mode.as_str())),
            config.lock_timeout.map(|_| "lockTimeout (a hot call never waits for a row)".to_owned()),
            // Its config lives in shared memory, where only UTC (a static of the preloaded
            // library, at one address in every backend) may be pointed at.
            config
                .calendar
                .filter(|c| c.zone.name() != "UTC")
                .map(|c| format!("calendar windows in {} (hot ones are UTC's)", c.zone.name())),
        ];
        if let Some(setting) = uncovered.into_iter().flatten().next() {
            return Err(Error::NotSupported(format!("a hot limit with {setting}")));
        }
    }
    if !config.durable {
        memory(&config)?;
    }
    if config.kind == Kind::Concurrency {
        concurrency(&config)?;
    }
    if config.kind.capacity_is_rate() {
        let kind = config.kind.as_str();
        if config.capacity != config.rate {
            return Err(Error::InvalidConfig(format!(
                "a {kind} holds rate tokens: capacity must be NULL or equal to rate ({}), not {}",
                config.rate, config.capacity
            )));
        }
        if config.max_reserved.is_some() {
            return Err(Error::NotSupported(format!("a {kind} has no reservations: leave maxReserved out")));
        }
    }
    match config.start {
        Some(_) if !config.kind.has_windows() => {
            Err(Error::InvalidConfig("start applies only to a fixed, sliding or rolling window".into()))
        }
        Some(start) if clock::ms_to_pg_us(start).is_none() => Err(Error::TimeOutOfRange(format!(
            "start must be a finite instant PostgreSQL can store, not {start} ms since the epoch"
        ))),
        _ => Ok(config),
    }
}

/// What a memory limit's entry holds (docs/memory-limits.md): one escrow per key, of a fixed
/// size in shared memory, whose argument covers mode 'all' without min_gap, as a hot
/// limit's does.
fn memory(config: &Config) -> Result<()> {
    if config.hot {
        return Err(Error::InvalidConfig(
            "a limit is hot (its calls logged in rows, nothing queueing on one) or durable => false (no rows at all), not both".into(),
        ));
    }
    let uncovered = [
        (config.kind == Kind::Concurrency).then(|| "kind 'concurrency' (its slots are locks and leases already)".to_owned()),
        (config.kind == Kind::RollingWindow)
            .then(|| "kind 'rolling window' (a key's entry holds two counts; use a sliding window)".to_owned()),
        (config.shards > 1).then(|| "shards > 1 (nothing queues on a memory limit's key)".to_owned()),
        config.min_gap.map(|_| "minGap (a rollback of the last granted call would make a refusal wrong)".to_owned()),
        (config.mode != Mode::All).then(|| format!("mode '{}' (it counts denials)", config.mode.as_str())),
        config.lock_timeout.map(|_| "lockTimeout (a memory call has no row to wait for)".to_owned()),
    ];
    match uncovered.into_iter().flatten().next() {
        Some(setting) => Err(Error::NotSupported(format!("a memory limit (durable => false) with {setting}"))),
        None => Ok(()),
    }
}

/// What a concurrency limit is: `rate` whole slots held at once, one row of slots per key,
/// taken all or nothing, and none of what meters time (`period` is only how long a denied
/// call is told to wait when no lease ends sooner).
fn concurrency(config: &Config) -> Result<()> {
    if config.rate.fract() != 0.0 || config.rate > MAX_SLOTS {
        return Err(Error::OutOfRange(format!(
            "a concurrency limit holds a whole number of slots, 1 to {MAX_SLOTS}: rate must be one, not {}",
            config.rate
        )));
    }
    let meaningless = [
        (config.shards > 1).then_some("shards > 1 (its slots are one set per key)"),
        config.min_gap.map(|_| "minGap"),
        (config.mode != Mode::All).then_some("a mode other than 'all' (a slot is held or not)"),
        config.lock_timeout.map(|_| "lockTimeout (a call never waits for a slot another holds)"),
        config.deny_cache.map(|_| "denyCache (a slot frees whenever its holder ends)"),
        config.hot.then_some("hot (slots are held in the lock table already)"),
    ];
    match meaningless.into_iter().flatten().next() {
        Some(setting) => Err(Error::Concurrency(format!("a concurrency limit with {setting}"))),
        None => Ok(()),
    }
}

/// `v` between `low` and `high` (both included), or 22023 naming the range.
fn within(what: &str, v: f64, low: f64, high: f64, unit: &str) -> Result<()> {
    if (low..=high).contains(&v) {
        Ok(())
    } else {
        Err(Error::OutOfRange(format!("{what} must be between {low}{unit} and {high}{unit}, not {v}{unit}")))
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
