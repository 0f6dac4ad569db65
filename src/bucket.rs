//! The bucket arithmetic: pure functions over `(value, ts, counts)`, no PostgreSQL in here.
//!
//! Times are milliseconds since the Unix epoch and durations are milliseconds, as in the
//! Convex rate-limiter component, whose numbers the token bucket and fixed window reproduce
//! operation for operation (so floating point rounding matches too). Each later kind is a
//! module of its own.

pub mod calendar;
pub mod concurrency;
mod credit;
pub mod escrow;
mod modes;
mod rolling_window;
mod sliding_window;

mod convex;
mod plan;
mod shard;
mod types;

pub use calendar::Calendar;
pub use plan::{plan, plan_credit, Outcome};
pub use shard::{as_read, available, check, expires, fresh};
pub use types::*;
#[cfg(test)]
use {
    calendar::END_OF_TIME_MS,
    convex::storable_debt,
    shard::{carried, fresh_state, phase_fraction, reset_after},
};

#[cfg(test)]
mod tests;
