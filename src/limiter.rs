//! One whole decision: a block denies it outright and an allow lets it through, the deny
//! cache answers a denial it holds, and the rest is asked of the limit's store (`store`):
//! the rows of a durable limit (`rows`), a hot limit's escrow (`hot`), a memory limit's
//! entry (`memory`) or a concurrency limit's slots (`concurrency`). Each store keeps its own
//! concurrency control, runs the same bucket arithmetic and answers with its outcome's
//! decision (`bucket::Outcome::decision`).

use crate::config;
use crate::lists::{self, Listed};
use crate::shmem::deny_cache;
pub use crate::call::{Decision, Reason, Request};
use crate::bucket::{Config, State};
use crate::storage::leases::LeaseId;
use crate::storage::StateTable;

mod all;
pub mod concurrency;
pub mod held_shards;
pub mod hot;
pub mod in_flight;
pub mod memory;
mod rows;
mod store;
pub use all::{decide_all, place_memory_parts, unpin_memory_parts, Decided, Part};
use store::Store;

/// The answer to a call whose (name, key) is blocked or allowed: a block denies, with
/// `remaining` 0 and no `retry_after` if it is for ever; an allow is ok, `granted` the count
/// asked for and `remaining` the limit's `capacity` (nothing of it was used).
pub(crate) fn listed_decision(req: &Request<'_>, listed: Listed, capacity: f64) -> Decision {
    match listed {
        Listed::Blocked(retry_after) => Decision {
            ok: false,
            retry_after,
            remaining: 0.0,
            reset_after: retry_after.unwrap_or(0.0),
            granted: 0.0,
            reason: Some(Reason::Blocked),
            limited_by: Some(req.name.to_owned()),
        },
        Listed::Allowed => Decision {
            ok: true,
            retry_after: None,
            remaining: capacity,
            reset_after: 0.0,
            granted: req.count,
            reason: Some(Reason::Allowed),
            limited_by: None,
        },
    }
}

/// The whole decision of one call: a block denies it outright and an allow lets it through;
/// a check reads; a consuming call is answered from the deny cache when it holds a denial,
/// else consumes, and a denial it gets is remembered there. In shadow mode, a denial other
/// than a block is answered ok. `table` opens the state table, for the stores that read it.
pub fn decide(table: impl FnOnce() -> StateTable, req: &Request<'_>, config: &Config, consume: bool) -> Decision {
    if let Some(listed) = lists::listed(req) {
        return listed_decision(req, listed, config.capacity);
    }
    let d = if !consume {
        check(&table(), req, config)
    } else if let Some(d) = deny_cache::answer(req, config) {
        d
    } else {
        let d = self::consume(table, req, config);
        deny_cache::remember(req, config, &d);
        d
    };
    d.shadowed(config::shadow(config))
}

/// `acquire`: as `decide` for a consuming call, the slots held as `hold` says; with a
/// lease, its id.
pub fn acquire(req: &Request<'_>, config: &Config, hold: concurrency::Hold) -> (Decision, Option<LeaseId>) {
    if let Some(listed) = lists::listed(req) {
        return (listed_decision(req, listed, config.capacity), None);
    }
    let (d, lease) = concurrency::acquire(req, config, hold);
    (d.shadowed(config::shadow(config)), lease)
}

/// Whether `config`'s keys are counted in shared memory alone (a memory limit): its call
/// needs nothing of `rate_limiter.state` but the gate (`shmem::gate`).
pub fn counted_in_memory(config: &Config) -> bool {
    Store::of(config) == Store::Memory
}

/// Answer without writing or locking anything (`check_rate_limit`).
pub fn check(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    Store::of(config).check(table, req, config)
}

/// Consume (`rate_limit`), with the state table `table` opens if the store reads it.
pub fn consume(table: impl FnOnce() -> StateTable, req: &Request<'_>, config: &Config) -> Decision {
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
