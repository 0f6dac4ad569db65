//! The SQL surface: thin `#[pg_extern]` functions that validate arguments, resolve the
//! config and hand over to the limiter.
//!
//! `rate_limit` and `check_rate_limit` themselves are PL/pgSQL in `sql/finalize.sql`
//! (SECURITY DEFINER, qualified names), because only SQL-level code can raise the custom
//! SQLSTATE `RL429` for `throws => true`; they call `_decide` here. Everything is VOLATILE
//! (it reads the clock and writes state) and PARALLEL UNSAFE (it takes row locks and writes).

use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::JsonB;

use crate::bucket::Config;
use crate::clock;
use crate::config::{self, LimitRow};
use crate::error::{Error, Result};
use crate::limiter::{self, Decision, Request};
use crate::storage;

pub const MAX_NAME_BYTES: usize = 128;
pub const MAX_KEY_BYTES: usize = 1024;

fn valid_name(name: Option<&str>) -> Result<&str> {
    match name {
        None => Err(Error::InvalidArgument("name must not be NULL".into())),
        Some("") => Err(Error::InvalidArgument("name must not be empty".into())),
        Some(n) if n.len() > MAX_NAME_BYTES => Err(Error::InvalidArgument(format!(
            "name is {} bytes, more than {MAX_NAME_BYTES}",
            n.len()
        ))),
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
    })
}

/// The inline config when given, else the named limit's row.
fn resolve(client: &SpiClient<'_>, name: &str, inline: Option<JsonB>) -> Result<Config> {
    match inline {
        Some(JsonB(value)) => config::from_json(&value),
        None => storage::load_limit(client, name)
            .ok_or_else(|| Error::UnknownLimit(name.to_owned()))
            .and_then(|row| Config::try_from(&row)),
    }
}

fn decide_or_err(
    name: Option<&str>,
    key: Option<&str>,
    count: Option<f64>,
    reserve: Option<bool>,
    inline: Option<JsonB>,
    consume: bool,
) -> Result<Decision> {
    let req = request(name, key, count, reserve)?;
    Spi::connect(|client| {
        let config = resolve(client, req.name, inline)?;
        if let Some(max) = config.impossible_count(req.count, req.reserve) {
            return Err(Error::CountExceedsMax { name: req.name.to_owned(), count: req.count, max });
        }
        Ok(if consume {
            limiter::consume(client, &req, &config)
        } else {
            limiter::check(client, &req, &config)
        })
    })
}

/// The core of `rate_limit` (consume => true) and `check_rate_limit` (consume => false).
/// Not granted to anyone: callers go through those two SECURITY DEFINER wrappers.
#[pg_extern(name = "_decide", volatile, parallel_unsafe)]
fn decide(
    name: Option<&str>,
    key: Option<&str>,
    count: Option<f64>,
    reserve: Option<bool>,
    config: Option<JsonB>,
    consume: Option<bool>,
) -> pgrx::composite_type!('static, "rate_limiter.decision") {
    let d = decide_or_err(name, key, count, reserve, config, consume.unwrap_or(false))
        .unwrap_or_else(|e| e.raise());
    let mut tuple = PgHeapTuple::new_composite_type("rate_limiter.decision")
        .expect("rate_limiter.decision exists while the extension does");
    let set = "rate_limiter.decision has its declared columns";
    tuple.set_by_name("ok", d.ok).expect(set);
    tuple.set_by_name("retry_after", d.retry_after).expect(set);
    tuple.set_by_name("remaining", d.remaining).expect(set);
    tuple.set_by_name("reset_after", d.reset_after).expect(set);
    tuple.set_by_name("granted", d.granted).expect(set);
    tuple
}

/// Forget the state of (name, key), every shard.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
fn reset_rate_limit(name: Option<&str>, key: default!(Option<&str>, "NULL")) {
    let name = valid_name(name).unwrap_or_else(|e| e.raise());
    Spi::connect(|client| storage::delete(client, name, key));
}

/// The stored state of (name, key): the fullest of `sample_shards` random shards.
#[pg_extern(security_definer, volatile, parallel_unsafe)]
fn rate_limit_value(
    name: Option<&str>,
    key: default!(Option<&str>, "NULL"),
    config: default!(Option<JsonB>, "NULL"),
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
        let req = request(name, key, Some(0.0), None)?;
        let sample = match sample_shards {
            Some(n) if n >= 1 => n as u32,
            other => {
                return Err(Error::InvalidArgument(format!("sample_shards must be >= 1, not {other:?}")))
            }
        };
        Spi::connect(|client| {
            let mut config = resolve(client, req.name, config)?;
            let (state, shard) = limiter::value(client, &req, &config, sample);
            if config.kind == crate::bucket::Kind::FixedWindow && config.start.is_none() {
                // As the Convex component does: report the window phase in force.
                config.start = Some(state.ts);
            }
            let effective = JsonB(config::to_json(&config));
            Ok((state.value, clock::ms_timestamptz(state.ts), shard, effective))
        })
    })()
    .unwrap_or_else(|e| e.raise());
    TableIterator::once(row)
}

/// Create or replace a named limit (an upsert into `rate_limiter.limits`).
#[pg_extern(security_definer, volatile, parallel_unsafe)]
#[allow(clippy::too_many_arguments)]
fn define(
    name: Option<&str>,
    kind: Option<&str>,
    rate: Option<f64>,
    period: Option<Interval>,
    capacity: default!(Option<f64>, "NULL"),
    max_reserved: default!(Option<f64>, "NULL"),
    shards: default!(Option<i32>, 1),
    start: default!(Option<TimestampWithTimeZone>, "NULL"),
) {
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
        };
        // Validate here for a clear message; the table's CHECK constraints are the backstop.
        Config::try_from(&row)?;
        Spi::connect(|client| storage::upsert_limit(client, &row, name));
        Ok(())
    })();
    result.unwrap_or_else(|e| e.raise())
}
