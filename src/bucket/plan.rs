//! The planning that combines shards: a call over the shards it looked at (`plan`, with the
//! modes of `modes.rs`), a credit (`plan_credit`, with `credit.rs`), and what it reports.

use super::shard::{check, expires_of_shard, reset_after};
use super::types::{Check, Config, State};
use super::{credit, modes};
use crate::call::{Decision, Reason};

/// One value for each shard a call looked at (one or two), inline: a call allocates nothing
/// for them.
#[derive(Clone, Debug, PartialEq)]
pub enum PerShard<T> {
    One([T; 1]),
    Two([T; 2]),
}

impl<T> std::ops::Deref for PerShard<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            PerShard::One(one) => one,
            PerShard::Two(two) => two,
        }
    }
}

impl<T> std::ops::DerefMut for PerShard<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            PerShard::One(one) => one,
            PerShard::Two(two) => two,
        }
    }
}

impl<T> FromIterator<T> for PerShard<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        let mut items = items.into_iter();
        let first = items.next().expect("a call looks at a shard");
        match items.next() {
            None => PerShard::One([first]),
            Some(second) => {
                assert!(items.next().is_none(), "a call looks at one or two shards");
                PerShard::Two([first, second])
            }
        }
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
    pub after: PerShard<(State, bool)>,
    /// Per looked-at shard: tokens left as of now after the call.
    pub available: PerShard<f64>,
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
        let reset_after = self.after.iter().map(|(s, _)| reset_after(s, &self.per_shard, self.at)).fold(0.0, f64::max);
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
        expires_of_shard(&self.after[i].0, &self.per_shard)
    }
}

/// Take `count` from the looked-at shards, as the Convex component does: with one shard,
/// from it; with two, from the one that can serve alone (the fuller when both can), else from
/// both so they end level, else deny. `config` is the limit's, split per shard here.
pub fn plan(states: &[State], config: &Config, now: f64, count: f64, reserve: bool) -> Outcome {
    let shards = config.shards;
    let config = &config.per_shard();
    // `taken[i]`: the check of shard i when the call changes it; a shard it leaves is only
    // refilled (not computed for a lone shard the call takes from, the usual case).
    let outcome = |ok: bool, granted: f64, denied: &Check, taken: [Option<Check>; 2]| {
        let changed = [taken[0].is_some(), taken[1].is_some()];
        let after: PerShard<Check> =
            taken.into_iter().zip(states).map(|(t, s)| t.unwrap_or_else(|| check(s, config, now, 0.0, false))).collect();
        Outcome {
            ok,
            retry_after: denied.retry_after,
            after: after.iter().zip(changed).map(|(c, t)| (c.state(), t)).collect(),
            available: after.iter().map(|c| c.available).collect(),
            granted,
            reason: denied.reason,
            at: now,
            shards,
            per_shard: *config,
        }
    };
    let taking = |i: usize, c: &Check| {
        let mut taken = [None, None];
        taken[i] = Some(c.clone());
        outcome(true, count, c, taken)
    };
    let checks: PerShard<Check> = states.iter().map(|s| check(s, config, now, count, reserve)).collect();
    match &checks[..] {
        [one] if one.ok => taking(0, one),
        [one] => match modes::instead_of_denial(&states[0], one, config, now, count) {
            Some(modes::Instead::Partial(part, amount)) => outcome(true, amount, one, [Some(part), None]),
            Some(modes::Instead::Penalty(penalized)) => outcome(false, 0.0, &penalized.clone(), [Some(penalized), None]),
            None => outcome(false, 0.0, one, [None, None]),
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
            let one = check(&states[0], config, now, one.available + count - balance / 2.0, reserve);
            let two = check(&states[1], config, now, two.available + count - balance / 2.0, reserve);
            let retry_after = match (one.retry_after, two.retry_after) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0.0).max(b.unwrap_or(0.0))),
            };
            let both = Check { retry_after, ..one.clone() };
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
    let refilled: PerShard<Check> = states.iter().map(|s| check(s, config, now, 0.0, false)).collect();
    let emptiest = (0..states.len())
        .min_by(|a, b| refilled[*a].available.total_cmp(&refilled[*b].available))
        .expect("a call looks at a shard");
    let (credited, given) = credit::credit(&states[emptiest], config, now, count);
    let mut after = refilled;
    after[emptiest] = check(&credited, config, now, 0.0, false);
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
