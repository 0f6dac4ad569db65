//! What the bucket arithmetic is about: the kinds, a limit's config, a shard's state and the
//! answer of a check. Every kind (`convex.rs`, `sliding_window.rs`, `rolling_window.rs`) and
//! the planning that combines them (`plan.rs`) build on these; none of these calls back up.

use super::calendar::Calendar;
use crate::call::Reason;

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
    /// One shard's share of a limit of several (`per_shard`): its state keeps no capacity
    /// mark, so that a change of the number of shards, which moves a key's count between
    /// shards, never reads one share's use as the whole key's (`shard::carried`).
    pub split: bool,
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
            split: true,
            ..*self
        }
    }

    /// Fixed window: the start of the window `windows` after the one starting at `start`.
    pub(super) fn window_after(&self, start: f64, windows: f64) -> f64 {
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
/// rolling window's cells); absent ones are 0. Up to two inline, more (a rolling window's
/// cells) on the heap: a call moves its states dozens of times, and a state of all 65 cells
/// inline (560 bytes) cost a memory limit's call a fifth of its instructions in copies.
#[derive(Clone, Debug)]
pub struct Counts(Cells);

#[derive(Clone, Debug)]
enum Cells {
    Few(u8, [f64; 2]),
    Many(Box<[f64]>),
}

impl Counts {
    pub const NONE: Counts = Counts(Cells::Few(0, [0.0; 2]));

    /// `None` when there are more than `MAX_COUNTS`.
    pub fn new(counts: &[f64]) -> Option<Counts> {
        Some(Counts(match counts {
            [] => Cells::Few(0, [0.0; 2]),
            [a] => Cells::Few(1, [*a, 0.0]),
            [a, b] => Cells::Few(2, [*a, *b]),
            _ if counts.len() <= MAX_COUNTS => Cells::Many(counts.into()),
            _ => return None,
        }))
    }

    pub fn as_slice(&self) -> &[f64] {
        match &self.0 {
            Cells::Few(len, counts) => &counts[..usize::from(*len)],
            Cells::Many(counts) => counts,
        }
    }

    pub fn get(&self, i: usize) -> f64 {
        self.as_slice().get(i).copied().unwrap_or(0.0)
    }
}

impl PartialEq for Counts {
    fn eq(&self, other: &Counts) -> bool {
        self.as_slice() == other.as_slice()
    }
}

/// One shard's stored state.
#[derive(Clone, Debug, PartialEq)]
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

    /// The capacity a token bucket's or fixed window's value was written under, if it says:
    /// its one count, negated (`capacity_mark`), which no count of taken tokens is (a sliding
    /// window row of 0.4.0 keeps one count too, its previous window's).
    pub fn written_under(&self) -> Option<f64> {
        match self.counts.as_slice() {
            [mark] if *mark < 0.0 => Some(-mark),
            _ => None,
        }
    }

    /// A token bucket's or fixed window's counts: the capacity its value is what is left of.
    pub fn capacity_mark(capacity: f64) -> Counts {
        Counts::new(&[-capacity]).expect("one count")
    }
}

/// Outcome of taking `count` from a shard at `now`.
#[derive(Clone, Debug, PartialEq)]
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
        State { value: self.value, ts: self.ts, counts: self.counts.clone(), granted_at: self.granted_at }
    }
}


#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// All of `count` or nothing.
    All,
    /// As much of `count` as there is now (whole tokens when `count` is whole).
    Partial,
    /// Denied calls are taken too, down to `-capacity`, so that a client that keeps calling
    /// stays locked out, but never for ever.
    Penalize,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::All => "all",
            Mode::Partial => "partial",
            Mode::Penalize => "penalize",
        }
    }
}
