//! One whole decision: a block denies it outright and an allow lets it through, the deny
//! cache answers a denial it holds, and the rest is asked of the limit's store (`store`):
//! the rows of a durable limit (`rows`), a hot limit's escrow (`hot`), a memory limit's
//! entry (`memory`) or a concurrency limit's slots (`concurrency`). Each store keeps its own
//! concurrency control, runs the same bucket arithmetic and answers through `decision`.

use crate::config;
use crate::lists;
use crate::shmem::deny_cache;
pub use crate::call::{Decision, Reason, Request};
use crate::bucket::{self, Config, Outcome, State};
use crate::storage::leases::LeaseId;
use crate::storage::StateTable;

mod all;
pub mod concurrency;
pub mod hot;
mod in_flight;
pub mod memory;
mod rows;
mod store;
pub use all::{decide_all, Decided, Part};
use store::Store;

fn fresh(req: &Request<'_>, config: &Config, now: f64) -> State {
    let phase = bucket::phase_fraction(req.name, req.key) * config.period;
    bucket::fresh_state(config, now, phase.floor())
}

fn decision(req: &Request<'_>, outcome: &Outcome, config: &Config, per_shard: &Config, now: f64) -> Decision {
    // Sharded limits report an estimate from the shards looked at, scaled to all shards.
    let looked = outcome.after.len() as f64;
    let total: f64 = outcome.available.iter().sum();
    let reset_after = outcome
        .after
        .iter()
        .map(|(s, _)| bucket::reset_after(*s, per_shard, now))
        .fold(0.0, f64::max);
    Decision {
        ok: outcome.ok,
        retry_after: outcome.retry_after,
        remaining: total * f64::from(config.shards) / looked,
        reset_after,
        granted: outcome.granted,
        reason: (!outcome.ok).then_some(outcome.reason),
        limited_by: (!outcome.ok).then(|| req.name.to_owned()),
    }
}

/// The whole decision of one call: a block denies it outright and an allow lets it through;
/// a check reads; a consuming call is answered from the deny cache when it holds a denial,
/// else consumes, and a denial it gets is remembered there. In shadow mode, a denial other
/// than a block is answered ok.
pub fn decide(table: &StateTable, req: &Request<'_>, config: &Config, consume: bool) -> Decision {
    if let Some(d) = lists::listed(req, config.capacity) {
        return d;
    }
    let d = if !consume {
        check(table, req, config)
    } else if let Some(d) = deny_cache::answer(req, config) {
        d
    } else {
        let d = self::consume(table, req, config);
        deny_cache::remember(req, config, &d);
        d
    };
    shadowed(d, config::shadow(config))
}

/// `acquire`: as `decide` for a consuming call, the slots held as `hold` says; with a
/// lease, its id.
pub fn acquire(req: &Request<'_>, config: &Config, hold: concurrency::Hold) -> (Decision, Option<LeaseId>) {
    if let Some(d) = lists::listed(req, config.capacity) {
        return (d, None);
    }
    let (d, lease) = concurrency::acquire(req, config, hold);
    (shadowed(d, config::shadow(config)), lease)
}

/// `d` as shadow mode answers it: a denial other than a block is ok, with reason `shadow`,
/// nothing granted, and what it would have said of the limit (`retry_after`, `remaining`,
/// `limited_by`). The call took nothing it would not have taken denied: the write path
/// decided a denial before this (the penalize mode's count stays counted).
pub fn shadowed(d: Decision, shadow: bool) -> Decision {
    if d.ok || !shadow || d.reason == Some(Reason::Blocked) {
        return d;
    }
    Decision { ok: true, granted: 0.0, reason: Some(Reason::Shadow), ..d }
}

/// Answer without writing or locking anything (`check_rate_limit`).
pub fn check(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    Store::of(config).check(table, req, config)
}

/// Consume (`rate_limit`).
pub fn consume(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    Store::of(config).consume(table, req, config)
}

/// Give `req.count` tokens back (`credit`). It waits for a row that another transaction
/// holds, whatever the limit's `lock_timeout`: a give-back is never dropped. A denial cached
/// for the key is forgotten.
pub fn credit(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    let config = Config { lock_timeout: None, ..*config };
    let d = Store::of(&config).credit(table, req, &config);
    if d.granted < 0.0 {
        deny_cache::forget_pair(req.name, req.key);
    }
    d
}

/// The stored state of (name, key), as `rate_limit_value` reports it: of a sharded limit, the
/// fullest of `sample_shards` random shards, and which.
pub fn value(table: &StateTable, req: &Request<'_>, config: &Config, sample_shards: u32) -> (State, i32) {
    Store::of(config).value(table, req, config, sample_shards)
}
