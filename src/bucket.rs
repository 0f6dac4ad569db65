//! The bucket arithmetic: pure functions over `(value, ts, counts)`, no PostgreSQL in here.
//!
//! Times are milliseconds since the Unix epoch and durations are milliseconds, as in the
//! Convex rate-limiter component, whose numbers the token bucket and fixed window reproduce
//! operation for operation (so floating point rounding matches too). Each later kind is a
//! module of its own.

mod modes;
mod rolling_window;
mod sliding_window;

pub use modes::Mode;

/// Below this many shards a call looks at one random shard; from here on it looks at two.
pub const MIN_CHOOSE_TWO: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    RollingWindow,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token bucket",
            Kind::FixedWindow => "fixed window",
            Kind::SlidingWindow => "sliding window",
            Kind::RollingWindow => "rolling window",
        }
    }

    /// Whether a value may go below zero for reservations.
    pub fn can_reserve(self) -> bool {
        matches!(self, Kind::TokenBucket | Kind::FixedWindow)
    }

    /// Whether windows (or cells) are aligned to `start` or a per-(name, key) phase.
    pub fn has_windows(self) -> bool {
        !matches!(self, Kind::TokenBucket)
    }

    /// Whether the limit holds `rate` tokens, no other capacity.
    pub fn capacity_is_rate(self) -> bool {
        matches!(self, Kind::SlidingWindow | Kind::RollingWindow)
    }
}

/// A validated limit with its defaults filled in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    pub kind: Kind,
    /// Tokens added per period.
    pub rate: f64,
    /// Milliseconds.
    pub period: f64,
    /// Most tokens that can accumulate (defaults to `rate`).
    pub capacity: f64,
    /// Most tokens that may be owed by reservations; `None` means unbounded.
    pub max_reserved: Option<f64>,
    pub shards: u32,
    /// Window phase, ms since the epoch; `None` picks one per (name, key).
    pub start: Option<f64>,
    /// Least milliseconds between two granted calls of one (name, key).
    pub min_gap: Option<f64>,
    pub mode: Mode,
    /// Rolling window: the cells a period is cut into (0 for the other kinds).
    pub buckets: u32,
    /// Most milliseconds a consuming call waits for another transaction's row lock; `None`
    /// waits as `UPDATE` does. Not arithmetic, but part of the limit's config.
    pub lock_timeout: Option<f64>,
    pub on_lock_timeout: OnLockTimeout,
    /// Most milliseconds a denial may be answered again from memory, without reading the
    /// state (`deny_cache`); `None` never. Not arithmetic either.
    pub deny_cache: Option<f64>,
}

/// What a call answers when `lock_timeout` passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLockTimeout {
    /// Denied, `reason = 'lock_timeout'`.
    Deny,
    /// Let through unmetered: ok, `granted = 0`, `reason = 'lock_timeout'`.
    Allow,
}

impl OnLockTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            OnLockTimeout::Deny => "deny",
            OnLockTimeout::Allow => "allow",
        }
    }
}

/// A rolling window's cells per period when not given: ten cells keep a token counting at
/// most a tenth of a period too long, and the row under 200 bytes with short names and keys
/// (189 in bench/kinds.md); more cells tighten that at a cost per call.
pub const DEFAULT_BUCKETS: u32 = 10;
/// At most 64 cells: 65 counts (520 bytes) beside the longest name and key stay below the
/// 2,032 bytes from which PostgreSQL would compress or TOAST the row.
pub const MAX_BUCKETS: u32 = 64;

impl Config {
    /// The share of the limit one shard holds: rate, capacity and max_reserved divided evenly.
    pub fn per_shard(&self) -> Config {
        let n = f64::from(self.shards);
        if self.shards == 1 {
            return *self;
        }
        Config {
            rate: self.rate / n,
            capacity: self.capacity / n,
            max_reserved: self.max_reserved.map(|m| m / n),
            ..*self
        }
    }

    /// How many shards one call may draw from, as the Convex component counts it.
    fn shard_factor(&self) -> f64 {
        if self.shards < MIN_CHOOSE_TWO {
            1.0
        } else {
            f64::from(self.shards) / 2.0
        }
    }

    /// The largest count a single call could ever be granted, rendered as the Convex
    /// component renders it in its error; `None` when the count is possible.
    pub fn impossible_count(&self, count: f64, reserve: bool) -> Option<String> {
        let factor = self.shard_factor();
        let max = self.capacity / factor;
        let limit = if reserve {
            let max_reserved = self.max_reserved? / factor;
            (count > max + max_reserved).then(|| format!("{:.2}", max + max_reserved))
        } else {
            (count > max).then(|| format!("{max}"))
        }?;
        let per_shards = if self.shards > 1 {
            format!(" per {} shards", self.shards)
        } else {
            String::new()
        };
        Some(format!("{limit}{per_shards}"))
    }
}

/// Most token counts a state keeps beside its value: a rolling window's cells.
pub const MAX_COUNTS: usize = MAX_BUCKETS as usize + 1;

/// Token counts a kind keeps beside `value` (the sliding window's previous window, the
/// rolling window's cells); absent ones are 0. A fixed array, so that `State` stays `Copy`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Counts {
    len: usize,
    counts: [f64; MAX_COUNTS],
}

impl Counts {
    pub const NONE: Counts = Counts { len: 0, counts: [0.0; MAX_COUNTS] };

    /// `None` when there are more than `MAX_COUNTS`.
    pub fn new(counts: &[f64]) -> Option<Counts> {
        let mut c = Counts { len: counts.len(), ..Counts::NONE };
        c.counts.get_mut(..counts.len())?.copy_from_slice(counts);
        Some(c)
    }

    pub fn as_slice(&self) -> &[f64] {
        &self.counts[..self.len]
    }

    pub fn get(&self, i: usize) -> f64 {
        self.as_slice().get(i).copied().unwrap_or(0.0)
    }
}

/// One shard's stored state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct State {
    pub value: f64,
    /// Token bucket: last update. Fixed and sliding window: start of the window `value`
    /// belongs to.
    pub ts: f64,
    pub counts: Counts,
    /// The last granted call, while `min_gap` after it has not passed.
    pub granted_at: Option<f64>,
}

impl State {
    pub fn new(value: f64, ts: f64) -> State {
        State { value, ts, counts: Counts::NONE, granted_at: None }
    }
}

pub use crate::call::Reason;

/// The state of a shard nobody has touched yet: full, and for a window kind in the window
/// that contains `now`, aligned to `start` or else to `phase`.
pub fn fresh_state(config: &Config, now: f64, phase: f64) -> State {
    let anchor = config.start.unwrap_or(phase);
    let ts = match config.kind {
        Kind::TokenBucket => now,
        Kind::FixedWindow | Kind::SlidingWindow => anchor + ((now - anchor) / config.period).floor() * config.period,
        Kind::RollingWindow => rolling_window::cell_start(config, anchor, now),
    };
    State::new(config.capacity, ts)
}

/// Outcome of taking `count` from a shard at `now`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Check {
    pub ok: bool,
    /// The shard's value after taking `count` (negative when short or reserving).
    pub value: f64,
    pub ts: f64,
    pub counts: Counts,
    /// Tokens left as of now after taking `count`: `value`, except where earlier windows
    /// still weigh (sliding window).
    pub available: f64,
    /// Milliseconds until the shard could cover `count`; `None` when it already can.
    pub retry_after: Option<f64>,
    pub granted_at: Option<f64>,
    /// Why it is denied, when it is.
    pub reason: Reason,
}

impl Check {
    /// The state to store when the call takes from this shard.
    pub fn state(&self) -> State {
        State { value: self.value, ts: self.ts, counts: self.counts, granted_at: self.granted_at }
    }
}

/// Refill `state` up to `now`, take `count`, and say whether that is allowed: the kind's
/// tokens, and `min_gap` after the last granted call.
pub fn check(state: State, config: &Config, now: f64, count: f64, reserve: bool) -> Check {
    let mut c = match config.kind {
        Kind::SlidingWindow => sliding_window::check(state, config, now, count),
        Kind::RollingWindow => rolling_window::check(state, config, now, count),
        Kind::TokenBucket | Kind::FixedWindow => convex_check(state, config, now, count, reserve),
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

/// The instant PostgreSQL can no longer store (294277-01-01, its END_TIMESTAMP), in ms since
/// the Unix epoch.
pub const END_OF_TIME_MS: f64 = 9_224_318_016_000_000.0;

/// What one (name, key) may owe without `max_reserved`: as much as refills from `now` until
/// two periods before the last instant PostgreSQL can store, less a capacity. So a wait and a
/// row's `expires` are always storable instants that `prune()` reaches, however large a count
/// a caller reserves (Convex's own bound is none).
pub fn storable_debt(config: &Config, now: f64) -> f64 {
    let periods = (END_OF_TIME_MS - now) / config.period - 2.0;
    (periods * config.rate - config.capacity).max(0.0)
}

/// The token bucket and fixed window, as the Convex component computes them.
/// Elapsed time never counts negative, so a clock that steps back refills nothing.
fn convex_check(state: State, config: &Config, now: f64, count: f64, reserve: bool) -> Check {
    let elapsed = (now - state.ts).max(0.0);
    let (value, ts, retry_after) = match config.kind {
        Kind::SlidingWindow | Kind::RollingWindow => unreachable!("not a Convex kind"),
        Kind::TokenBucket => {
            let rate = config.rate / config.period;
            let value = (state.value + elapsed * rate).min(config.capacity) - count;
            let retry_after = (value < 0.0).then(|| -value / rate);
            (value, now.max(state.ts), retry_after)
        }
        Kind::FixedWindow => {
            let elapsed_windows = (elapsed / config.period).floor();
            let value =
                (state.value + config.rate * elapsed_windows).min(config.capacity) - count;
            let ts = state.ts + elapsed_windows * config.period;
            let retry_after = (value < 0.0).then(|| {
                let windows_needed = (-value / config.rate).ceil();
                ts + config.period * windows_needed - now
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
        counts: state.counts,
        available: value,
        retry_after,
        granted_at: None,
        reason: Reason::Exhausted,
    }
}

/// What a call does to the shards it looked at.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub ok: bool,
    /// Milliseconds to wait: before retrying when denied, before doing the reserved work
    /// when ok by reservation; `None` when ok with nothing to wait for.
    pub retry_after: Option<f64>,
    /// Per looked-at shard (same order as the input): its state after the call, and whether
    /// the call changed it (so it must be written).
    pub after: Vec<(State, bool)>,
    /// Per looked-at shard: tokens left as of now after the call.
    pub available: Vec<f64>,
    /// Tokens taken: `count` when ok, less in the partial mode, 0 when denied.
    pub granted: f64,
    /// Why it is denied, when it is.
    pub reason: Reason,
}

/// Take `count` from the looked-at shards, as the Convex component does: with one shard,
/// from it; with two, from the one that can serve alone (the fuller when both can), else from
/// both so they end level, else deny. `config` is the per-shard config.
pub fn plan(states: &[State], config: &Config, now: f64, count: f64, reserve: bool) -> Outcome {
    let refilled: Vec<Check> = states.iter().map(|s| check(*s, config, now, 0.0, false)).collect();
    // `taken[i]`: the check of shard i when the call changes it.
    let outcome = |ok: bool, granted: f64, denied: &Check, taken: [Option<Check>; 2]| {
        let after: Vec<Check> = (0..states.len()).map(|i| taken[i].unwrap_or(refilled[i])).collect();
        Outcome {
            ok,
            retry_after: denied.retry_after,
            after: after.iter().zip(&taken).map(|(c, t)| (c.state(), t.is_some())).collect(),
            available: after.iter().map(|c| c.available).collect(),
            granted,
            reason: denied.reason,
        }
    };
    let taking = |i: usize, c: Check| {
        let mut taken = [None, None];
        taken[i] = Some(c);
        outcome(true, count, &c, taken)
    };
    let checks: Vec<Check> = states.iter().map(|s| check(*s, config, now, count, reserve)).collect();
    match checks[..] {
        [one] if one.ok => taking(0, one),
        [one] => match modes::instead_of_denial(states[0], one, config, now, count) {
            Some(modes::Instead::Partial(part, amount)) => outcome(true, amount, &one, [Some(part), None]),
            Some(modes::Instead::Penalty(penalized)) => outcome(false, 0.0, &penalized, [Some(penalized), None]),
            None => outcome(false, 0.0, &one, [None, None]),
        },
        [one, two] if one.ok && two.ok => {
            if one.available > two.available {
                taking(0, one)
            } else {
                taking(1, two)
            }
        }
        [one, _] if one.ok => taking(0, one),
        [_, two] if two.ok => taking(1, two),
        [one, two] => {
            // Neither can serve alone: take from both so they end level.
            let balance = one.available + two.available + count;
            let one = check(states[0], config, now, one.available + count - balance / 2.0, reserve);
            let two = check(states[1], config, now, two.available + count - balance / 2.0, reserve);
            let retry_after = match (one.retry_after, two.retry_after) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0.0).max(b.unwrap_or(0.0))),
            };
            let both = Check { retry_after, ..one };
            if one.ok && two.ok {
                outcome(true, count, &both, [Some(one), Some(two)])
            } else {
                outcome(false, 0.0, &both, [None, None])
            }
        }
        _ => unreachable!("a call looks at one or two shards"),
    }
}

/// Milliseconds until a shard holding `state` at `now` is full again.
pub fn reset_after(state: State, config: &Config, now: f64) -> f64 {
    let missing = config.capacity - state.value;
    match config.kind {
        Kind::SlidingWindow => sliding_window::reset_after(state, config, now),
        Kind::RollingWindow => rolling_window::reset_after(state, config, now),
        _ if missing <= 0.0 => 0.0,
        Kind::TokenBucket => missing / (config.rate / config.period),
        Kind::FixedWindow => (state.ts + config.period * (missing / config.rate).ceil() - now).max(0.0),
    }
}

/// The instant (ms) from which `state` holds exactly what a fresh state would: refilled to
/// capacity, nothing owed or still weighing, and (window kinds) in a window aligned as a
/// fresh one is. From then on the row can be deleted without changing any decision.
/// Computed in closed form, then checked with `check` itself, so that rounding can only
/// make it later, never early.
pub fn expires(state: State, config: &Config) -> f64 {
    let full = |at: f64| {
        let c = check(state, config, at, 0.0, false);
        c.value >= config.capacity
            && at >= state.ts
            && c.counts.as_slice().iter().all(|n| *n == 0.0)
            && c.granted_at.is_none()
    };
    let mut at = match config.kind {
        Kind::TokenBucket => state.ts + ((config.capacity - state.value) / (config.rate / config.period)).max(0.0),
        Kind::FixedWindow => {
            let windows = ((config.capacity - state.value) / config.rate).ceil().max(0.0);
            state.ts + windows * config.period
        }
        Kind::SlidingWindow => sliding_window::expires(state, config),
        Kind::RollingWindow => rolling_window::expires(state, config),
    }
    .max(state.granted_at.zip(config.min_gap).map_or(f64::NEG_INFINITY, |(at, gap)| at + gap))
    .ceil();
    // Later by a growing step until `check` agrees: rarely more than one round.
    let unit = match config.kind {
        Kind::TokenBucket => 1.0,
        Kind::RollingWindow => config.period / f64::from(config.buckets),
        Kind::FixedWindow | Kind::SlidingWindow => config.period,
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

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: f64 = 1_000.0;
    const MINUTE: f64 = 60.0 * SECOND;
    const HOUR: f64 = 60.0 * MINUTE;
    const NOW: f64 = 1_700_000_000_000.0;
    /// The Convex component's kinds, whose vectors these are.
    const KINDS: [Kind; 2] = [Kind::TokenBucket, Kind::FixedWindow];
    const ALL_KINDS: [Kind; 4] = [Kind::TokenBucket, Kind::FixedWindow, Kind::SlidingWindow, Kind::RollingWindow];

    fn config(kind: Kind, rate: f64, period: f64) -> Config {
        Config {
            kind,
            rate,
            period,
            capacity: rate,
            max_reserved: None,
            shards: 1,
            start: None,
            min_gap: None,
            mode: Mode::All,
            buckets: if kind == Kind::RollingWindow { DEFAULT_BUCKETS } else { 0 },
            lock_timeout: None,
            on_lock_timeout: OnLockTimeout::Deny,
            deny_cache: None,
        }
    }

    fn at(value: f64, ts: f64) -> State {
        State::new(value, ts)
    }

    fn state_of(check: Check) -> State {
        check.state()
    }

    #[test]
    fn simple_success_and_failure() {
        for kind in KINDS {
            let c = config(kind, 1.0, SECOND);
            let ok = check(at(1.0, NOW), &c, NOW, 1.0, false);
            assert!(ok.ok);
            assert_eq!(ok.value, 0.0);
            assert_eq!(ok.retry_after, None);
            let denied = check(at(0.0, NOW), &c, NOW, 1.0, false);
            assert!(!denied.ok);
            assert_eq!(denied.retry_after, Some(SECOND));
            let owed = check(at(-1.0, NOW), &c, NOW, 1.0, false);
            assert_eq!(owed.retry_after, Some(2.0 * SECOND));
        }
    }

    #[test]
    fn burst_up_to_capacity() {
        for kind in KINDS {
            let c = Config { capacity: 3.0, ..config(kind, 1.0, SECOND) };
            let all = check(at(3.0, NOW), &c, NOW, 3.0, false);
            assert!(all.ok);
            assert_eq!((all.value, all.retry_after), (0.0, None));
            let too_much = check(at(3.0, NOW), &c, NOW, 4.0, false);
            assert!(!too_much.ok);
            assert_eq!((too_much.value, too_much.retry_after), (-1.0, Some(SECOND)));
        }
    }

    /// Convex: "retryAfter is accurate", 10 per minute.
    #[test]
    fn retry_after_is_accurate() {
        for kind in KINDS {
            let c = config(kind, 10.0, MINUTE);
            let one = check(at(10.0, NOW), &c, NOW, 5.0, false);
            assert!(one.ok && one.retry_after.is_none());
            let later = if kind == Kind::TokenBucket { one.ts + 6.0 * SECOND } else { one.ts + MINUTE };
            let two = check(state_of(one), &c, later, 6.0, false);
            assert!(two.ok && two.retry_after.is_none());
            let expected = if kind == Kind::TokenBucket { 0.0 } else { 4.0 };
            assert_eq!(two.value, expected);
            let three = check(state_of(two), &c, later, 10.0, false);
            assert!(!three.ok);
            assert_eq!(three.retry_after, Some(MINUTE));
        }
    }

    /// The same vectors with 6 s between calls for both kinds, as the issue states them.
    #[test]
    fn six_seconds_later_fixed_window_keeps_its_window() {
        let c = config(Kind::FixedWindow, 10.0, MINUTE);
        let one = check(at(10.0, NOW), &c, NOW, 5.0, false);
        let two = check(state_of(one), &c, NOW + 6.0 * SECOND, 6.0, false);
        assert!(!two.ok, "only 5 left in this window");
        assert_eq!(two.retry_after, Some(MINUTE - 6.0 * SECOND));
    }

    /// Convex: "retryAfter for reserved is accurate".
    #[test]
    fn retry_after_for_reserved_is_accurate() {
        for kind in KINDS {
            let c = config(kind, 10.0, MINUTE);
            let one = check(at(10.0, NOW), &c, NOW, 5.0, false);
            let later = if kind == Kind::TokenBucket { one.ts + 6.0 * SECOND } else { one.ts + MINUTE };
            let two = check(state_of(one), &c, later, 16.0, true);
            assert!(two.ok);
            assert_eq!(two.retry_after, Some(MINUTE));
            let expected = if kind == Kind::TokenBucket { -10.0 } else { -6.0 };
            assert_eq!(two.value, expected);

            let three = check(state_of(two), &c, two.ts + 30.0 * SECOND, 5.0, true);
            assert!(three.ok);
            match kind {
                Kind::TokenBucket => {
                    assert_eq!(three.retry_after, Some(MINUTE));
                    assert_eq!(three.value, -10.0);
                }
                _ => {
                    assert_eq!(three.retry_after, Some(30.0 * SECOND + MINUTE));
                    assert_eq!(three.value, -11.0);
                }
            }
        }
    }

    #[test]
    fn reservations_without_and_with_max() {
        for kind in KINDS {
            let unbounded = config(kind, 1.0, HOUR);
            let reserved = check(at(0.0, NOW), &unbounded, NOW, 100.0, true);
            assert!(reserved.ok);
            let first_wait = reserved.retry_after.unwrap();
            assert!(first_wait > 0.0);
            let followup = check(state_of(reserved), &unbounded, NOW, 1.0, false);
            assert!(!followup.ok);
            assert!(followup.retry_after.unwrap() > first_wait);

            let bounded = Config { max_reserved: Some(1.0), ..config(kind, 1.0, HOUR) };
            let reserved = check(at(1.0, NOW), &bounded, NOW, 2.0, true);
            assert!(reserved.ok);
            let followup = check(state_of(reserved), &bounded, NOW, 1.0, true);
            assert!(!followup.ok, "a second reservation would owe 2 > max_reserved 1");
            assert!(followup.retry_after.unwrap() > reserved.retry_after.unwrap());
        }
    }

    /// Without max_reserved, a reservation may owe until shortly before PostgreSQL's last
    /// storable instant and no further: a count of 1e300 is denied, not owed until infinity.
    #[test]
    fn reservations_without_max_stay_storable() {
        for kind in KINDS {
            let c = config(kind, 1.0, SECOND);
            let years = check(at(1.0, NOW), &c, NOW, 1e9, true);
            assert!(years.ok, "31 years of debt is still a reservation");
            let limit = storable_debt(&c, NOW);
            let at_limit = check(at(c.capacity, NOW), &c, NOW, c.capacity + limit, true);
            assert!(at_limit.ok);
            let end = expires(state_of(at_limit), &c);
            assert!(end < END_OF_TIME_MS && NOW + at_limit.retry_after.unwrap() < END_OF_TIME_MS, "{kind:?}: {end}");
            let past = check(at(c.capacity, NOW), &c, NOW, c.capacity + limit * 1.001, true);
            assert!(!past.ok, "{kind:?}: past the storable debt");
            let huge = check(at(1.0, NOW), &c, NOW, 1e300, true);
            assert!(!huge.ok && huge.retry_after.unwrap().is_finite());
            let bounded = Config { max_reserved: Some(1e300), ..c };
            assert!(check(at(1.0, NOW), &bounded, NOW, 1e300, true).ok, "an explicit max_reserved is the bound");
        }
    }

    #[test]
    fn zero_max_reserved_allows_no_reservation() {
        let c = Config { max_reserved: Some(0.0), ..config(Kind::TokenBucket, 1.0, SECOND) };
        assert!(!check(at(0.0, NOW), &c, NOW, 1.0, true).ok);
    }

    #[test]
    fn token_bucket_refills_continuously_up_to_capacity() {
        let c = config(Kind::TokenBucket, 10.0, MINUTE);
        // Convex shared.test: 5 tokens, 30 s later, take 8 -> 2; take 15 -> -5 and wait 30 s.
        let s = at(5.0, NOW - 30.0 * SECOND);
        assert_eq!(check(s, &c, NOW, 0.0, false).value, 10.0);
        assert_eq!(check(s, &c, NOW, 8.0, false).value, 2.0);
        let over = check(s, &c, NOW, 15.0, false);
        assert_eq!((over.value, over.retry_after), (-5.0, Some(30.0 * SECOND)));
        assert_eq!(over.ts, NOW);
    }

    #[test]
    fn fixed_window_adds_rate_per_elapsed_window() {
        let c = config(Kind::FixedWindow, 10.0, MINUTE);
        let start = NOW - 30.0 * SECOND;
        let same = check(at(5.0, start), &c, start + 45.0 * SECOND, 0.0, false);
        assert_eq!((same.value, same.ts), (5.0, start));
        let next = check(at(5.0, start), &c, start + 90.0 * SECOND, 0.0, false);
        assert_eq!((next.value, next.ts), (10.0, start + MINUTE));
    }

    #[test]
    fn a_clock_that_steps_back_refills_nothing() {
        for kind in KINDS {
            let c = config(kind, 10.0, MINUTE);
            let back = check(at(2.0, NOW), &c, NOW - 10.0 * MINUTE, 1.0, false);
            assert_eq!(back.value, 1.0);
            assert_eq!(back.ts, NOW, "ts never moves backwards");
        }
    }

    #[test]
    fn fresh_state_is_full_and_window_aligned() {
        let tb = config(Kind::TokenBucket, 3.0, SECOND);
        assert_eq!(fresh_state(&tb, NOW, 0.0), at(3.0, NOW));
        let fw = Config { start: Some(NOW - 2.5 * MINUTE), ..config(Kind::FixedWindow, 3.0, MINUTE) };
        assert_eq!(fresh_state(&fw, NOW, 0.0).ts, NOW - 30.0 * SECOND);
        let future = Config { start: Some(NOW + 10.0 * SECOND), ..fw.clone() };
        assert_eq!(fresh_state(&future, NOW, 0.0).ts, NOW - 50.0 * SECOND);
        let phased = Config { start: None, ..fw };
        let ts = fresh_state(&phased, NOW, 12_345.0).ts;
        assert!(ts <= NOW && NOW - ts < MINUTE);
        assert_eq!((ts - 12_345.0) % MINUTE, 0.0);
    }

    #[test]
    fn phase_is_stable_and_spread() {
        let a = phase_fraction("api", Some("u1"));
        assert_eq!(a, phase_fraction("api", Some("u1")));
        assert_ne!(a, phase_fraction("api", Some("u2")));
        assert_ne!(phase_fraction("api", None), phase_fraction("api", Some("")));
        let phases: Vec<f64> = (0..1000).map(|i| phase_fraction("n", Some(&i.to_string()))).collect();
        assert!(phases.iter().all(|p| (0.0..1.0).contains(p)));
        let low = phases.iter().filter(|p| **p < 0.5).count();
        assert!((400..600).contains(&low), "{low} of 1000 in the lower half");
    }

    #[test]
    fn reset_after_counts_to_full() {
        let tb = config(Kind::TokenBucket, 10.0, MINUTE);
        assert_eq!(reset_after(at(10.0, NOW), &tb, NOW), 0.0);
        assert_eq!(reset_after(at(4.0, NOW), &tb, NOW), 36.0 * SECOND);
        let fw = config(Kind::FixedWindow, 10.0, MINUTE);
        assert_eq!(reset_after(at(4.0, NOW - 10.0 * SECOND), &fw, NOW), 50.0 * SECOND);
        assert_eq!(reset_after(at(-6.0, NOW), &fw, NOW), 2.0 * MINUTE);
    }

    #[test]
    fn impossible_counts_match_convex_messages() {
        let c = config(Kind::FixedWindow, 1.0, SECOND);
        assert_eq!(c.impossible_count(2.0, false).as_deref(), Some("1"));
        assert_eq!(c.impossible_count(1.0, false), None);
        assert_eq!(c.impossible_count(1e9, true), None, "unbounded reservations");
        let bounded = Config { max_reserved: Some(2.0), ..c.clone() };
        assert_eq!(bounded.impossible_count(4.0, true).as_deref(), Some("3.00"));
        assert_eq!(bounded.impossible_count(3.0, true), None);
        let sharded = Config { shards: 4, capacity: 40.0, ..c };
        assert_eq!(sharded.impossible_count(21.0, false).as_deref(), Some("20 per 4 shards"));
        assert_eq!(sharded.impossible_count(20.0, false), None);
        let two = Config { shards: 2, ..sharded };
        assert_eq!(two.impossible_count(41.0, false).as_deref(), Some("40 per 2 shards"));
    }

    #[test]
    fn per_shard_divides_the_limit() {
        let c = Config { shards: 4, max_reserved: Some(8.0), capacity: 40.0, ..config(Kind::TokenBucket, 20.0, SECOND) };
        let s = c.per_shard();
        assert_eq!((s.rate, s.capacity, s.max_reserved), (5.0, 10.0, Some(2.0)));
    }

    /// Deleting a row once `expires` has passed changes no decision: random call sequences
    /// on a fake clock give identical outcomes with and without pruning between calls.
    #[test]
    fn pruning_expired_state_changes_no_decision() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(8);
        for round in 0..4_000 {
            let kind = ALL_KINDS[round % 4];
            let rate = f64::from(rng.gen_range(1..20));
            let period = f64::from(rng.gen_range(1..5_000));
            let c = Config {
                capacity: if kind.can_reserve() { rate * f64::from(rng.gen_range(1..4)) } else { rate },
                max_reserved: (kind.can_reserve() && rng.gen_bool(0.3)).then(|| f64::from(rng.gen_range(0..10))),
                min_gap: rng.gen_bool(0.3).then(|| f64::from(rng.gen_range(0..period as u32))),
                mode: [Mode::All, Mode::Partial, Mode::Penalize][rng.gen_range(0..3)],
                buckets: if kind == Kind::RollingWindow { rng.gen_range(1..=MAX_BUCKETS) } else { 0 },
                start: rng.gen_bool(0.5).then(|| NOW - f64::from(rng.gen_range(0..100_000))),
                ..config(kind, rate, period)
            };
            let phase = f64::from(rng.gen_range(0..period as u32));
            let (mut kept, mut pruned): (Option<State>, Option<State>) = (None, None);
            let mut now = NOW;
            for _ in 0..40 {
                let gap = f64::from(rng.gen_range(0..(3.0 * period) as u32));
                // Prune at some instant between the last call and this one.
                let prune_at = now + f64::from(rng.gen_range(0..=gap as u32));
                now += gap;
                if pruned.is_some_and(|s| expires(s, &c) <= prune_at) {
                    pruned = None;
                }
                let count = f64::from(rng.gen_range(0..(c.capacity as u32 + 2)));
                let reserve = kind.can_reserve() && c.mode == Mode::All && rng.gen_bool(0.2);
                let mut call = |stored: &mut Option<State>| {
                    let state = stored.unwrap_or_else(|| fresh_state(&c, now, phase));
                    let outcome = plan(&[state], &c, now, count, reserve);
                    if outcome.after[0].1 {
                        *stored = Some(outcome.after[0].0);
                    }
                    let reset = reset_after(outcome.after[0].0, &c, now);
                    (outcome, reset)
                };
                assert_eq!(call(&mut kept), call(&mut pruned), "round {round}, {c:?}");
            }
        }
    }

    #[test]
    fn expires_is_when_a_state_is_fresh_again() {
        let tb = config(Kind::TokenBucket, 10.0, MINUTE);
        assert_eq!(expires(at(4.0, NOW), &tb), NOW + 36.0 * SECOND);
        assert_eq!(expires(at(10.0, NOW), &tb), NOW);
        let owed = expires(at(-10.0, NOW), &tb);
        assert_eq!(owed, NOW + 2.0 * MINUTE, "debts are paid first");
        let fw = config(Kind::FixedWindow, 10.0, MINUTE);
        assert_eq!(expires(at(4.0, NOW), &fw), NOW + MINUTE);
        assert_eq!(expires(at(-6.0, NOW), &fw), NOW + 2.0 * MINUTE);
        assert_eq!(expires(at(10.0, NOW), &fw), NOW);
    }

    /// The vector: rate 10 per 60 s, windows from T0.
    #[test]
    fn sliding_window_vector() {
        let c = Config { start: Some(NOW), ..config(Kind::SlidingWindow, 10.0, MINUTE) };
        let mut state = fresh_state(&c, NOW + 30.0 * SECOND, 0.0);
        let mut call = |at: f64, count: f64| {
            let outcome = plan(&[state], &c, at, count, false);
            if outcome.ok {
                state = outcome.after[0].0;
            }
            (outcome.ok, outcome.available[0], outcome.retry_after)
        };
        assert_eq!(call(NOW + 30.0 * SECOND, 4.0), (true, 6.0, None));
        assert_eq!(call(NOW + 75.0 * SECOND, 5.0), (true, 2.0, None), "4 * 3/4 + 5 = 8 weigh");
        assert_eq!(call(NOW + 75.0 * SECOND, 2.0), (true, 0.0, None));
        let denied = call(NOW + 75.0 * SECOND, 1.0);
        assert_eq!((denied.0, denied.2), (false, Some(15.0 * SECOND)), "4 * 1/2 + 7 + 1 = 10 at T0 + 90 s");
        assert_eq!(call(NOW + 90.0 * SECOND, 1.0), (true, 0.0, None));
        assert_eq!(reset_after(state, &c, NOW + 90.0 * SECOND), 90.0 * SECOND, "8 taken weigh until T0 + 180 s");
        assert_eq!(expires(state, &c), NOW + 180.0 * SECOND);
    }

    /// Upstash floors the previous window's share and compares before adding the count:
    /// at a quarter into a window after 10 of 10 were taken, it lets 3 through (floor(7.5) = 7
    /// < 10), which makes 10.5 weigh. Here 2 pass and the third waits.
    #[test]
    fn sliding_window_never_lets_the_weight_exceed_the_rate() {
        let c = Config { start: Some(NOW), ..config(Kind::SlidingWindow, 10.0, MINUTE) };
        let full = plan(&[fresh_state(&c, NOW, 0.0)], &c, NOW, 10.0, false).after[0].0;
        let quarter = NOW + 75.0 * SECOND;
        assert!(plan(&[full], &c, quarter, 2.0, false).ok);
        let three = plan(&[full], &c, quarter, 3.0, false);
        assert!(!three.ok);
        assert_eq!(three.retry_after, Some(0.05 * MINUTE), "7.5 - 0.5 + 3 = 10 at 30 % in");
    }

    /// Random sequences: whenever a call is denied, `retry_after` is the earliest instant
    /// (to 1 ms) at which the same call passes; a granted call never makes more than `rate`
    /// weigh. The clock may step back.
    #[test]
    fn sliding_window_retry_after_is_exact_and_the_bound_holds() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(9);
        for round in 0..2_000 {
            let rate = f64::from(rng.gen_range(1..20));
            let period = f64::from(rng.gen_range(10..5_000));
            let c = Config { start: rng.gen_bool(0.5).then_some(NOW), ..config(Kind::SlidingWindow, rate, period) };
            let mut state = fresh_state(&c, NOW, 3.0);
            let mut now = NOW;
            for _ in 0..40 {
                now += f64::from(rng.gen_range(0..(2.0 * period) as u32)) - period / 10.0;
                let count = f64::from(rng.gen_range(0..=rate as u32)) * if rng.gen_bool(0.3) { 0.5 } else { 1.0 };
                let outcome = plan(&[state], &c, now, count, false);
                if outcome.ok {
                    state = outcome.after[0].0;
                    assert!(outcome.available[0] >= -1e-9, "round {round}: {outcome:?}");
                    continue;
                }
                let retry = outcome.retry_after.expect("a denial says when");
                assert!(retry > 0.0, "round {round}");
                assert!(plan(&[state], &c, now + retry, count, false).ok, "round {round}: passes at retry_after");
                if retry > 1.0 {
                    assert!(!plan(&[state], &c, now + retry - 1.0, count, false).ok, "round {round}: not 1 ms earlier");
                }
            }
        }
    }

    #[test]
    fn min_gap_spaces_granted_calls() {
        let c = Config { min_gap: Some(100.0), ..config(Kind::TokenBucket, 10.0, SECOND) };
        let first = plan(&[at(10.0, NOW)], &c, NOW, 1.0, false);
        assert!(first.ok);
        let state = first.after[0].0;
        assert_eq!(state.granted_at, Some(NOW));
        let soon = plan(&[state], &c, NOW + 40.0, 1.0, false);
        assert_eq!((soon.ok, soon.reason, soon.retry_after), (false, Reason::MinGap, Some(60.0)));
        assert!(!soon.after[0].1, "a denial writes nothing");
        assert!(plan(&[state], &c, NOW + 100.0, 1.0, false).ok, "exactly min_gap later");
        // The limit's own wait wins when it is later.
        let owing = State { value: -1.0, ..state };
        assert_eq!(plan(&[owing], &c, NOW + 40.0, 1.0, false).retry_after, Some(160.0));
        // Count 0 answers without moving the gap.
        assert_eq!(plan(&[at(10.0, NOW)], &c, NOW, 0.0, false).after[0].0.granted_at, None);
        assert_eq!(expires(state, &c), NOW + 100.0, "refilled at once, but the gap lasts");
    }

    #[test]
    fn partial_mode_takes_what_there_is() {
        let c = Config { mode: Mode::Partial, ..config(Kind::TokenBucket, 10.0, 10.0 * SECOND) };
        let some = plan(&[at(3.0, NOW)], &c, NOW, 5.0, false);
        assert_eq!((some.ok, some.granted, some.retry_after), (true, 3.0, Some(2.0 * SECOND)), "5 in 2 s");
        assert_eq!(some.after[0].0.value, 0.0);
        let whole = plan(&[at(2.5, NOW)], &c, NOW, 3.0, false);
        assert_eq!(whole.granted, 2.0, "whole tokens for a whole count");
        assert_eq!(plan(&[at(1.2, NOW)], &c, NOW, 2.5, false).granted, 1.2);
        let none = plan(&[at(0.5, NOW)], &c, NOW, 2.0, false);
        assert_eq!((none.ok, none.granted, none.reason), (false, 0.0, Reason::Exhausted));
        let sliding = Config { mode: Mode::Partial, ..config(Kind::SlidingWindow, 10.0, MINUTE) };
        let state = State { value: 4.0, ts: NOW, counts: Counts::new(&[0.0]).unwrap(), granted_at: None };
        assert_eq!(plan(&[state], &sliding, NOW, 9.0, false).granted, 4.0);
    }

    #[test]
    fn penalize_mode_counts_denied_calls_down_to_minus_capacity() {
        let c = Config { mode: Mode::Penalize, ..config(Kind::TokenBucket, 10.0, 10.0 * SECOND) };
        let denied = plan(&[at(0.0, NOW)], &c, NOW, 4.0, false);
        assert_eq!((denied.ok, denied.granted, denied.after[0]), (false, 0.0, (at(-4.0, NOW), true)));
        assert_eq!(denied.retry_after, Some(8.0 * SECOND), "the 4 owed, then 4 more");
        assert_eq!(denied.available[0], -4.0);
        let capped = plan(&[at(-8.0, NOW)], &c, NOW, 4.0, false);
        assert_eq!(capped.after[0].0.value, -10.0, "never below -capacity");
        assert_eq!(capped.retry_after, Some(14.0 * SECOND));
        let fixed = Config { mode: Mode::Penalize, ..config(Kind::FixedWindow, 10.0, MINUTE) };
        assert_eq!(plan(&[at(1.0, NOW)], &fixed, NOW, 30.0 - 19.0, false).after[0].0.value, -10.0);
        let sliding = Config { mode: Mode::Penalize, ..config(Kind::SlidingWindow, 10.0, MINUTE) };
        let full = State { value: 0.0, ts: NOW, counts: Counts::new(&[0.0]).unwrap(), granted_at: None };
        let over = plan(&[full], &sliding, NOW, 25.0 - 15.0, false);
        assert_eq!(over.after[0].0.value, -10.0, "at most 2 x rate taken in a window");
        assert_eq!(over.retry_after, Some(2.0 * MINUTE), "10 more need the 20 taken to weigh nothing");
    }

    /// The vector: rate 3 per 1000 ms in 10 cells from T0.
    #[test]
    fn rolling_window_vector() {
        let c = Config { start: Some(NOW), ..config(Kind::RollingWindow, 3.0, SECOND) };
        let mut state = fresh_state(&c, NOW, 0.0);
        let mut call = |at: f64| {
            let outcome = plan(&[state], &c, NOW + at, 1.0, false);
            if outcome.ok {
                state = outcome.after[0].0;
            }
            (outcome.ok, outcome.retry_after)
        };
        for at in [0.0, 100.0, 500.0] {
            assert_eq!(call(at), (true, None));
        }
        assert_eq!(call(900.0), (false, Some(200.0)), "the token of 0 counts until 1100");
        assert_eq!(call(1100.0), (true, None));
        assert_eq!(call(1150.0), (false, Some(50.0)), "the token of 100 counts until 1200");
        assert_eq!(state.counts.as_slice().len(), 11);
        assert_eq!(reset_after(state, &c, NOW + 1150.0), 1050.0, "the token of 1100 counts until 2200");
        assert_eq!(expires(state, &c), NOW + 2200.0);
    }

    /// Random sequences: no interval of `period` ever holds more than `rate` granted tokens,
    /// and a denial's `retry_after` is the earliest instant (to 1 ms) at which it passes.
    #[test]
    fn rolling_window_bound_holds_and_retry_after_is_exact() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(10);
        for round in 0..2_000 {
            let rate = f64::from(rng.gen_range(1..20));
            let period = f64::from(rng.gen_range(100..5_000));
            let buckets = rng.gen_range(1..=MAX_BUCKETS);
            let c = Config { buckets, start: rng.gen_bool(0.5).then_some(NOW), ..config(Kind::RollingWindow, rate, period) };
            let mut state = fresh_state(&c, NOW, 7.0);
            let mut now = NOW;
            let mut grants: Vec<(f64, f64)> = Vec::new();
            for _ in 0..60 {
                now += f64::from(rng.gen_range(0..(period / 2.0) as u32));
                let count = f64::from(rng.gen_range(0..=rate as u32)) * if rng.gen_bool(0.3) { 0.5 } else { 1.0 };
                let outcome = plan(&[state], &c, now, count, false);
                if outcome.ok {
                    state = outcome.after[0].0;
                    grants.push((now, count));
                    let recent: f64 = grants.iter().filter(|(t, _)| now - t < period).map(|(_, n)| n).sum();
                    assert!(recent <= rate, "round {round}: {recent} in one period");
                    continue;
                }
                let retry = outcome.retry_after.expect("a denial says when");
                assert!(plan(&[state], &c, now + retry, count, false).ok, "round {round}: passes at retry_after");
                if retry > 1.0 {
                    assert!(!plan(&[state], &c, now + retry - 1.0, count, false).ok, "round {round}: not 1 ms earlier");
                }
            }
        }
    }
}
