//! Validating a parsed config: every number within the bounds below, and the combinations
//! each kind, mode and store (memory, concurrency) takes.

use crate::bucket::{Config, Kind, Mode};
use crate::clock;
use crate::error::{Error, Result};
use crate::settings::MAX_SLOTS;

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

pub(super) fn validate(config: Config) -> Result<Config> {
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
