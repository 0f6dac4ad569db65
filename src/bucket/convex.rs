//! The token bucket and fixed window, as the Convex component computes them: its numbers,
//! operation for operation (so floating point rounding matches too).

use super::calendar::END_OF_TIME_MS;
use super::types::{Check, Config, Counts, Kind, State};
use crate::call::Reason;

/// What one (name, key) may owe without `max_reserved`: as much as refills from `now` until
/// two periods before the last instant PostgreSQL can store, less a capacity. So a wait and a
/// row's `expires` are always storable instants that `prune()` reaches, however large a count
/// a caller reserves (Convex's own bound is none).
pub fn storable_debt(config: &Config, now: f64) -> f64 {
    // A calendar window is as long as its longest: a month of 31 days.
    let period = config.calendar.map_or(config.period, |c| c.longest_ms().max(config.period));
    let periods = (END_OF_TIME_MS - now) / period - 2.0;
    (periods * config.rate - config.capacity).max(0.0)
}

/// The token bucket and fixed window, as the Convex component computes them.
/// Elapsed time never counts negative, so a clock that steps back refills nothing.
pub(super) fn convex_check(state: &State, config: &Config, now: f64, count: f64, reserve: bool) -> Check {
    let elapsed = (now - state.ts).max(0.0);
    let (value, ts, retry_after) = match config.kind {
        Kind::SlidingWindow | Kind::RollingWindow | Kind::Concurrency => unreachable!("not a Convex kind"),
        Kind::TokenBucket => {
            let rate = config.rate / config.period;
            let value = (state.value + elapsed * rate).min(config.capacity) - count;
            let retry_after = (value < 0.0).then(|| -value / rate);
            (value, now.max(state.ts), retry_after)
        }
        Kind::FixedWindow => {
            let elapsed_windows = match &config.calendar {
                Some(c) => c.windows_between(state.ts, state.ts + elapsed),
                None => (elapsed / config.period).floor(),
            };
            let value =
                (state.value + config.rate * elapsed_windows).min(config.capacity) - count;
            let ts = config.window_after(state.ts, elapsed_windows);
            let retry_after = (value < 0.0).then(|| {
                let windows_needed = (-value / config.rate).ceil();
                config.window_after(ts, windows_needed) - now
            });
            (value, ts, retry_after)
        }
    };
    let over_reserved = -value > config.max_reserved.unwrap_or_else(|| storable_debt(config, now));
    let ok = value >= 0.0 || (reserve && !over_reserved);
    Check {
        ok,
        value,
        ts,
        // What the value is left of: a later config of another capacity keeps what was used.
        counts: if config.split { Counts::NONE } else { State::capacity_mark(config.capacity) },
        available: value,
        retry_after,
        granted_at: None,
        reason: Reason::Exhausted,
    }
}
