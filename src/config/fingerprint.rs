//! The fingerprint that keeps an inline config's state apart from every other config's, and
//! the effective config rendered back as jsonb.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::bucket::calendar::Unit;
use crate::bucket::{Config, Kind};
use crate::call::Fingerprint;

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
