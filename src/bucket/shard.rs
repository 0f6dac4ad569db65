//! One shard: a fresh state, the check of a call against it (its kind's arithmetic, then the
//! gap since its last grant), when it is full again and when its row can go. The kinds below
//! never call back up; the planning above (`plan.rs`, `modes.rs`, `credit.rs`) combines shards.

use super::convex::convex_check;
use super::types::{Check, Config, Counts, Kind, State};
use super::{rolling_window, sliding_window};
use crate::call::Reason;

/// The state of a shard of `name`'s `key` nobody has touched yet (`config` is the limit's,
/// split per shard here): full, and for a window kind in the window that contains `now`,
/// aligned to `start` or else to the key's own phase.
pub fn fresh(config: &Config, name: &str, key: Option<&str>, now: f64) -> State {
    let config = config.per_shard();
    let phase = phase_fraction(name, key) * config.period;
    fresh_state(&config, now, phase.floor())
}

/// The state of a shard nobody has touched yet: full, and for a window kind in the window
/// that contains `now`, aligned to `start` or else to `phase`.
pub fn fresh_state(config: &Config, now: f64, phase: f64) -> State {
    let anchor = config.start.unwrap_or(phase);
    let ts = match config.kind {
        Kind::TokenBucket => now,
        Kind::FixedWindow if config.calendar.is_some() => config.calendar.expect("a calendar").window_start(now),
        Kind::FixedWindow | Kind::SlidingWindow => anchor + ((now - anchor) / config.period).floor() * config.period,
        Kind::RollingWindow => rolling_window::cell_start(config, anchor, now),
        Kind::Concurrency => unreachable!("a concurrency limit has no state row"),
    };
    State::new(config.capacity, ts)
}

/// `state` as `config` reads it. A token bucket's or fixed window's value is what is left of
/// the capacity it was written under, which it keeps as its one count, negated (a row or
/// entry written before 0.8.0 has none, and is read as it stands). Under numbers of another capacity (an
/// override set, changed, removed or ended, a tier changed, the limit redefined) the key
/// keeps what it used: the token bucket its deficit below capacity, the fixed window the
/// tokens taken in its window. Numbers raised give the difference at once; lowered below what
/// was used, none until the bucket refills it, or (a fixed window) until the window ends: a
/// fixed window's debt of reservations is kept, never made deeper. A window kind reads such a
/// state as a row of another kind: tokens used, no counts. The state read is marked with the
/// new capacity, so that reading it again changes nothing.
pub(super) fn carried(state: &State, config: &Config) -> State {
    let Some(written_under) = state.written_under() else { return state.clone() };
    let used = written_under - state.value;
    let marked = State::capacity_mark(config.capacity);
    match config.kind {
        // A share of several shards reads the level as it stands (as before 0.8.0).
        Kind::TokenBucket | Kind::FixedWindow if config.split => State { counts: Counts::NONE, ..*state },
        Kind::TokenBucket => State { value: config.capacity - used, counts: marked, ..*state },
        Kind::FixedWindow => State { value: (config.capacity - used).max(state.value.min(0.0)), counts: marked, ..*state },
        Kind::Concurrency => state.clone(),
        Kind::SlidingWindow | Kind::RollingWindow => State { value: config.rate - used, counts: Counts::NONE, ..*state },
    }
}

/// `state` as a call under `config` (the limit's) reads it before any refill (`carried`):
/// what `rate_limit_value` reports.
pub fn as_read(state: &State, config: &Config) -> State {
    carried(state, &config.per_shard())
}

/// Refill `state` up to `now`, take `count`, and say whether that is allowed: the kind's
/// tokens, and `min_gap` after the last granted call.
pub fn check(state: &State, config: &Config, now: f64, count: f64, reserve: bool) -> Check {
    let state = carried(state, config);
    let mut c = match config.kind {
        Kind::SlidingWindow => sliding_window::check(&state, config, now, count),
        Kind::RollingWindow => rolling_window::check(&state, config, now, count),
        Kind::TokenBucket | Kind::FixedWindow | Kind::Concurrency => convex_check(&state, config, now, count, reserve),
    };
    // A gap that has passed is forgotten, so the row can expire.
    let gap_end = state.granted_at.zip(config.min_gap).map(|(at, gap)| at + gap).filter(|end| now < *end);
    c.granted_at = gap_end.and(state.granted_at);
    if let Some(end) = gap_end {
        c.ok = false;
        c.reason = Reason::MinGap;
        c.retry_after = Some(c.retry_after.unwrap_or(0.0).max(end - now));
    }
    if c.ok && count > 0.0 && config.min_gap.is_some() {
        c.granted_at = Some(now);
    }
    c
}

/// Milliseconds until a shard holding `state` at `now` is full again.
pub fn reset_after(state: &State, config: &Config, now: f64) -> f64 {
    let state = carried(state, config);
    let missing = config.capacity - state.value;
    match config.kind {
        Kind::SlidingWindow => sliding_window::reset_after(&state, config, now),
        Kind::RollingWindow => rolling_window::reset_after(&state, config, now),
        _ if missing <= 0.0 => 0.0,
        Kind::TokenBucket => missing / (config.rate / config.period),
        Kind::FixedWindow => (config.window_after(state.ts, (missing / config.rate).ceil()) - now).max(0.0),
        Kind::Concurrency => unreachable!("a concurrency limit has no state row"),
    }
}

/// The instant (ms) from which `state` holds exactly what a fresh state would: refilled to
/// capacity, nothing owed or still weighing, and (window kinds) in a window aligned as a
/// fresh one is. From then on the row can be deleted without changing any decision.
/// Computed in closed form, then checked with `check` itself, so that rounding can only
/// make it later, never early. `config` is the limit's, split per shard here.
pub fn expires(state: &State, config: &Config) -> f64 {
    expires_of_shard(state, &config.per_shard())
}

/// Tokens a shard holding `state` has as of `now` (`config` is the limit's).
pub fn available(state: &State, config: &Config, now: f64) -> f64 {
    check(state, &config.per_shard(), now, 0.0, false).available
}

/// `expires` with the config of one shard.
pub(super) fn expires_of_shard(state: &State, config: &Config) -> f64 {
    let state = carried(state, config);
    let full = |at: f64| {
        let c = check(&state, config, at, 0.0, false);
        // A token bucket's or fixed window's one count is its capacity, not tokens taken.
        let nothing_taken = c.state().written_under().is_some() || c.counts.as_slice().iter().all(|n| *n == 0.0);
        c.value >= config.capacity && at >= state.ts && nothing_taken && c.granted_at.is_none()
    };
    let mut at = match config.kind {
        Kind::TokenBucket => state.ts + ((config.capacity - state.value) / (config.rate / config.period)).max(0.0),
        Kind::FixedWindow => {
            let windows = ((config.capacity - state.value) / config.rate).ceil().max(0.0);
            config.window_after(state.ts, windows)
        }
        Kind::SlidingWindow => sliding_window::expires(&state, config),
        Kind::RollingWindow => rolling_window::expires(&state, config),
        Kind::Concurrency => unreachable!("a concurrency limit has no state row"),
    }
    .max(state.granted_at.zip(config.min_gap).map_or(f64::NEG_INFINITY, |(at, gap)| at + gap))
    .ceil();
    // Later by a growing step until `check` agrees: rarely more than one round.
    let unit = match config.kind {
        Kind::TokenBucket => 1.0,
        Kind::RollingWindow => config.period / f64::from(config.buckets),
        Kind::FixedWindow | Kind::SlidingWindow => config.period,
        Kind::Concurrency => unreachable!("a concurrency limit has no state row"),
    };
    let mut step = unit;
    for _ in 0..64 {
        if full(at) {
            return at;
        }
        at += step;
        step *= 2.0;
    }
    f64::INFINITY
}

/// A stable per-(name, key) fraction in [0, 1): where in its period a fixed window with no
/// `start` begins, so that keys don't all refill at the same instant.
pub fn phase_fraction(name: &str, key: Option<&str>) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |byte: u8| {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    };
    name.bytes().for_each(&mut feed);
    match key {
        Some(key) => {
            feed(1);
            key.bytes().for_each(&mut feed);
        }
        None => feed(0),
    }
    // FNV's high bits barely move for short keys; a splitmix64 finish spreads them.
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^= hash >> 31;
    (hash >> 11) as f64 / (1u64 << 53) as f64
}
