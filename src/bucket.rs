//! The bucket arithmetic: pure functions over `(value, ts, counts)`, no PostgreSQL in here.
//!
//! Times are milliseconds since the Unix epoch and durations are milliseconds, as in the
//! Convex rate-limiter component, whose numbers the token bucket and fixed window reproduce
//! operation for operation (so floating point rounding matches too). Each later kind is a
//! module of its own.

mod credit;
pub mod calendar;
pub mod concurrency;
pub mod escrow;
mod modes;
mod rolling_window;
mod sliding_window;

pub use calendar::Calendar;
pub use modes::Mode;

/// Below this many shards a call looks at one random shard; from here on it looks at two.
pub const MIN_CHOOSE_TWO: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    RollingWindow,
    /// At most `capacity` slots held at once (`bucket/concurrency.rs`): no state row, none
    /// of the functions below.
    Concurrency,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token bucket",
            Kind::FixedWindow => "fixed window",
            Kind::SlidingWindow => "sliding window",
            Kind::RollingWindow => "rolling window",
            Kind::Concurrency => "concurrency",
        }
    }

    /// Whether a value may go below zero for reservations.
    pub fn can_reserve(self) -> bool {
        matches!(self, Kind::TokenBucket | Kind::FixedWindow)
    }

    /// Whether windows (or cells) are aligned to `start` or a per-(name, key) phase.
    pub fn has_windows(self) -> bool {
        !matches!(self, Kind::TokenBucket | Kind::Concurrency)
    }

    /// Whether the limit holds `rate` tokens, no other capacity.
    pub fn capacity_is_rate(self) -> bool {
        matches!(self, Kind::SlidingWindow | Kind::RollingWindow | Kind::Concurrency)
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
    /// Consumed through an escrow in shared memory and a debit log instead of a row lock
    /// (`hot`, docs/hot-limits.md). Not arithmetic either.
    pub hot: bool,
    /// Counted in the database's tables (`true`), or in shared memory alone (`durable =>
    /// false`, docs/memory-limits.md). Not arithmetic either.
    pub durable: bool,
    /// Denials are answered; `false` is shadow mode: a call that would be denied is ok and
    /// takes nothing (docs/semantics.md). Not arithmetic either.
    pub enforce: bool,
    /// Fixed window: windows on the calendar (months, a day, a week in a time zone) instead
    /// of every `period` ms; `period` is then their nominal length.
    pub calendar: Option<Calendar>,
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
    /// The share of the limit one shard holds: rate, capacity and max_reserved divided evenly,
    /// a limit of one shard (so a share is never split again).
    pub fn per_shard(&self) -> Config {
        let n = f64::from(self.shards);
        if self.shards == 1 {
            return *self;
        }
        Config {
            rate: self.rate / n,
            capacity: self.capacity / n,
            max_reserved: self.max_reserved.map(|m| m / n),
            shards: 1,
            ..*self
        }
    }

    /// Fixed window: the start of the window `windows` after the one starting at `start`.
    fn window_after(&self, start: f64, windows: f64) -> f64 {
        match &self.calendar {
            Some(c) if windows > 0.0 => c.after(start, windows),
            Some(_) => start,
            None => start + windows * self.period,
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
use crate::call::Decision;

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
        Kind::TokenBucket | Kind::FixedWindow | Kind::Concurrency => convex_check(state, config, now, count, reserve),
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
    // A calendar window is as long as its longest: a month of 31 days.
    let period = config.calendar.map_or(config.period, |c| c.longest_ms().max(config.period));
    let periods = (END_OF_TIME_MS - now) / period - 2.0;
    (periods * config.rate - config.capacity).max(0.0)
}

/// The token bucket and fixed window, as the Convex component computes them.
/// Elapsed time never counts negative, so a clock that steps back refills nothing.
fn convex_check(state: State, config: &Config, now: f64, count: f64, reserve: bool) -> Check {
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
    /// The instant it was decided at.
    pub at: f64,
    /// The limit's shards, and the config of each: what the decision reports is of the
    /// whole limit.
    shards: u32,
    per_shard: Config,
}

impl Outcome {
    /// The call's decision, as the caller of limit `name` gets it. Sharded limits report an
    /// estimate from the shards looked at, scaled to all shards.
    pub fn decision(&self, name: &str) -> Decision {
        let looked = self.after.len() as f64;
        let total: f64 = self.available.iter().sum();
        let reset_after = self.after.iter().map(|(s, _)| reset_after(*s, &self.per_shard, self.at)).fold(0.0, f64::max);
        Decision {
            ok: self.ok,
            retry_after: self.retry_after,
            remaining: total * f64::from(self.shards) / looked,
            reset_after,
            granted: self.granted,
            reason: (!self.ok).then_some(self.reason),
            limited_by: (!self.ok).then(|| name.to_owned()),
        }
    }

    /// When the row of the `i`th shard looked at can go, as the call leaves it.
    pub fn expires(&self, i: usize) -> f64 {
        expires_of_shard(self.after[i].0, &self.per_shard)
    }
}

/// Take `count` from the looked-at shards, as the Convex component does: with one shard,
/// from it; with two, from the one that can serve alone (the fuller when both can), else from
/// both so they end level, else deny. `config` is the limit's, split per shard here.
pub fn plan(states: &[State], config: &Config, now: f64, count: f64, reserve: bool) -> Outcome {
    let shards = config.shards;
    let config = &config.per_shard();
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
            at: now,
            shards,
            per_shard: *config,
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

/// Give `count` tokens back to the looked-at shards, as the Convex component does: to the
/// emptiest of them (the fewest tokens available now), up to what it takes back (see
/// `credit`). `config` is the limit's, split per shard here. Always ok; `granted` is minus
/// what was given.
pub fn plan_credit(states: &[State], config: &Config, now: f64, count: f64) -> Outcome {
    let shards = config.shards;
    let config = &config.per_shard();
    let refilled: Vec<Check> = states.iter().map(|s| check(*s, config, now, 0.0, false)).collect();
    let emptiest = (0..states.len())
        .min_by(|a, b| refilled[*a].available.total_cmp(&refilled[*b].available))
        .expect("a call looks at a shard");
    let (credited, given) = credit::credit(states[emptiest], config, now, count);
    let mut after = refilled;
    after[emptiest] = check(credited, config, now, 0.0, false);
    Outcome {
        ok: true,
        retry_after: None,
        after: after.iter().enumerate().map(|(i, c)| (c.state(), i == emptiest && given > 0.0)).collect(),
        available: after.iter().map(|c| c.available).collect(),
        granted: 0.0 - given,
        reason: Reason::Exhausted,
        at: now,
        shards,
        per_shard: *config,
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
        Kind::FixedWindow => (config.window_after(state.ts, (missing / config.rate).ceil()) - now).max(0.0),
        Kind::Concurrency => unreachable!("a concurrency limit has no state row"),
    }
}

/// The instant (ms) from which `state` holds exactly what a fresh state would: refilled to
/// capacity, nothing owed or still weighing, and (window kinds) in a window aligned as a
/// fresh one is. From then on the row can be deleted without changing any decision.
/// Computed in closed form, then checked with `check` itself, so that rounding can only
/// make it later, never early. `config` is the limit's, split per shard here.
pub fn expires(state: State, config: &Config) -> f64 {
    expires_of_shard(state, &config.per_shard())
}

/// Tokens a shard holding `state` has as of `now` (`config` is the limit's).
pub fn available(state: State, config: &Config, now: f64) -> f64 {
    check(state, &config.per_shard(), now, 0.0, false).available
}

/// `expires` with the config of one shard.
fn expires_of_shard(state: State, config: &Config) -> f64 {
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
            config.window_after(state.ts, windows)
        }
        Kind::SlidingWindow => sliding_window::expires(state, config),
        Kind::RollingWindow => rolling_window::expires(state, config),
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

#[cfg(test)]
mod tests;
