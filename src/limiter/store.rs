//! Where a limit's counts live, the one thing a decision asks of each: the rows of a durable
//! limit, a hot limit's escrow over its log, a memory limit's entry in shared memory, or a
//! concurrency limit's slots. `Store::of` picks it from the config once; each of its calls
//! reads the state, runs the bucket arithmetic and settles with the store under that
//! store's own concurrency control, and answers with the outcome's decision
//! (`bucket::Outcome::decision`).

use crate::bucket::{Config, Kind, State};
use crate::call::{Decision, Request};
use crate::error::Error;
use crate::storage::StateTable;

use super::{concurrency, hot, memory, rows};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Store {
    /// `rate_limiter.state`, one row per shard (durable).
    Rows,
    /// A hot limit: an escrow in shared memory over its debit log.
    Hot,
    /// A memory limit (`durable => false`): an entry in shared memory alone.
    Memory,
    /// A concurrency limit: slots held by transactions or leases.
    Slots,
}

impl Store {
    pub fn of(config: &Config) -> Store {
        if config.kind == Kind::Concurrency {
            Store::Slots
        } else if config.hot {
            Store::Hot
        } else if !config.durable {
            Store::Memory
        } else {
            Store::Rows
        }
    }

    /// Answer without taking anything (`check_rate_limit`).
    pub fn check(self, table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
        match self {
            Store::Rows => rows::check(table, req, config),
            Store::Hot => hot::check(table, req, config),
            Store::Memory => memory::check(req, config),
            Store::Slots => concurrency::check(req, config),
        }
    }

    /// Take `req.count` (`rate_limit`); a slot is held until the transaction ends. The
    /// state table is opened (`table`) only for the stores that read it: a memory limit's
    /// call needs no more than the lock its caller took.
    pub fn consume(self, table: impl FnOnce() -> StateTable, req: &Request<'_>, config: &Config) -> Decision {
        match self {
            Store::Rows => rows::consume(&table(), req, config),
            Store::Hot => hot::consume(&table(), req, config),
            Store::Memory => memory::consume(req, config),
            Store::Slots => concurrency::acquire(req, config, concurrency::Hold::Transaction).0,
        }
    }

    /// Give `req.count` back (`credit`): a hot limit's log and a concurrency limit's slots
    /// take none (refused with 0A000 before this, by the API's checks).
    pub fn credit(self, table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
        match self {
            Store::Rows => rows::credit(table, req, config),
            Store::Memory => memory::credit(req, config),
            Store::Hot | Store::Slots => Error::NotSupported(format!("credit on the limit \"{}\"", req.name)).raise(),
        }
    }

    /// The state `rate_limit_value` reports, and its shard.
    pub fn value(self, table: &StateTable, req: &Request<'_>, config: &Config, sample_shards: u32) -> (State, i32) {
        match self {
            Store::Rows => rows::value(table, req, config, sample_shards),
            Store::Hot => (hot::value(table, req, config), 0),
            Store::Memory => (memory::value(req, config), 0),
            Store::Slots => {
                let (free, now) = concurrency::free(req, config);
                (State::new(free, now), 0)
            }
        }
    }
}
