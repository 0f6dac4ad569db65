//! The sliding window (Upstash Ratelimit's default), without its over-admission.
//!
//! Windows of `period` are aligned as the fixed window's. At `t`, a fraction `f` into the
//! window, the tokens taken in the previous window weigh `1 - f`: a call of `count` is
//! allowed iff `previous * (1 - f) + current + count <= rate`. Upstash floors the previous
//! window's share and compares before adding the count, which lets calls of more than one
//! token through beyond the rate; here the comparison is exact.
//!
//! Stored: `counts[0]` the tokens taken in the window before the one starting at `ts`,
//! `counts[1]` those taken in it, and `value` what is left of `rate` after them (as a fixed
//! window stores it), for a reader. The counts mean the same under any rate: a call or credit
//! under a lower or higher rate than the one that wrote them (a redefined limit, another
//! caller's inline config) neither forgets nor invents a taken token. 0.4.0 stored only
//! `value`, so a lower rate read it as negative use (99 calls admitted at a rate of 10) and a
//! credit under a rate of a million gave back a million; a row it wrote is read as
//! `rate - value`, never below 0, as a token bucket's capacity clamps its level.

use super::types::{Check, Config, Counts, State};
use crate::call::Reason;

/// The window `at` falls in, and the tokens taken in it and in the one before.
struct Windows {
    start: f64,
    current: f64,
    previous: f64,
}

/// The tokens taken in the window starting at `state.ts`.
fn current(state: &State, config: &Config) -> f64 {
    match state.counts.as_slice() {
        [_, current] => *current,
        // 0.4.0's row, or another kind's (a rolling window redefined as a sliding one).
        _ => (config.rate - state.value).max(0.0),
    }
}

fn windows(state: &State, config: &Config, at: f64) -> Windows {
    // A clock that steps back stays in the stored window.
    let elapsed = ((at - state.ts).max(0.0) / config.period).floor();
    let taken = current(state, config);
    let (previous, current) = match elapsed {
        0.0 => (state.counts.get(0), taken),
        1.0 => (taken, 0.0),
        _ => (0.0, 0.0),
    };
    Windows { start: state.ts + elapsed * config.period, current, previous }
}

/// The tokens taken in the window a state belongs to, and in the window before it (for a
/// state moved to the present by `check`: those that still weigh).
pub(super) fn taken(state: &State, config: &Config) -> (f64, f64) {
    (current(state, config), state.counts.get(0))
}

/// The state of the window starting at `ts` with `current` tokens taken in it and `previous`
/// in the window before.
pub(super) fn state(config: &Config, ts: f64, previous: f64, current: f64, granted_at: Option<f64>) -> State {
    let counts = Counts::new(&[previous, current]).expect("two counts");
    State { value: config.rate - current, ts, counts, granted_at }
}

/// Tokens that count against the rate at `at`.
fn weighted(w: &Windows, config: &Config, at: f64) -> f64 {
    let fraction = ((at - w.start) / config.period).clamp(0.0, 1.0);
    w.previous * (1.0 - fraction) + w.current
}

pub(super) fn check(state: &State, config: &Config, now: f64, count: f64) -> Check {
    let w = windows(state, config, now);
    let weighted = weighted(&w, config, now);
    let ok = weighted + count <= config.rate;
    let after = self::state(config, w.start, w.previous, w.current + count, None);
    Check {
        ok,
        value: after.value,
        ts: after.ts,
        counts: after.counts,
        available: config.rate - weighted - count,
        retry_after: (!ok).then(|| retry_at(state, config, now, count) - now),
        granted_at: None,
        reason: Reason::Exhausted,
    }
}

/// The earliest instant from `now` on at which taking `count` is allowed: while the
/// previous window's weight decays, or in the next window, where this window's tokens weigh.
/// Computed in closed form, then checked with `check` itself so that rounding can only make
/// it later. `count` is at most `rate` (larger counts are refused before).
fn retry_at(state: &State, config: &Config, now: f64, count: f64) -> f64 {
    let w = windows(state, config, now);
    let room = config.rate - w.current - count;
    let mut at = if room >= 0.0 && w.previous > 0.0 {
        w.start + (1.0 - room / w.previous) * config.period
    } else if w.current > config.rate - count {
        w.start + config.period + (1.0 - (config.rate - count) / w.current) * config.period
    } else {
        w.start + config.period
    };
    let mut step = at.abs() * f64::EPSILON;
    for _ in 0..128 {
        if at >= now && check_ok(state, config, at, count) {
            return at;
        }
        at = (at + step).max(now);
        step *= 2.0;
    }
    w.start + 2.0 * config.period
}

fn check_ok(state: &State, config: &Config, at: f64, count: f64) -> bool {
    let w = windows(state, config, at);
    weighted(&w, config, at) + count <= config.rate
}

/// Milliseconds from `now` until no taken token weighs any more.
pub(super) fn reset_after(state: &State, config: &Config, now: f64) -> f64 {
    let w = windows(state, config, now);
    let until = if w.current > 0.0 {
        w.start + 2.0 * config.period
    } else if w.previous > 0.0 {
        w.start + config.period
    } else {
        now
    };
    (until - now).max(0.0)
}

/// When nothing taken weighs any more (see `super::expires`).
pub(super) fn expires(state: &State, config: &Config) -> f64 {
    let taken = current(state, config);
    let windows = if taken > 0.0 {
        2.0
    } else if state.counts.get(0) > 0.0 {
        1.0
    } else {
        0.0
    };
    state.ts + windows * config.period
}
