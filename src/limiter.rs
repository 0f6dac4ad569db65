//! One rate-limit decision: which shards to look at, reading them, locking and writing
//! what the bucket math decided.
//!
//! A call first reads the committed state without locking. If that already denies, it
//! returns without taking a lock or writing. Otherwise it locks the shards it will take
//! from, reads the clock again (after the lock, so time never runs backwards under a
//! waiting transaction), decides again on the locked rows and writes.

use pgrx::spi::SpiClient;
use rand::seq::index::sample;

use crate::bucket::{self, Config, Outcome, State, MIN_CHOOSE_TWO};
use crate::clock;
use crate::storage::{self, Slot};

/// How many times a call re-picks shards when those it chose are locked by other
/// transactions, before it queues for its choice.
const SKIP_LOCKED_ROUNDS: usize = 3;

pub struct Request<'a> {
    pub name: &'a str,
    pub key: Option<&'a str>,
    pub count: f64,
    pub reserve: bool,
}

/// What `rate_limit()` returns, see `rate_limiter.decision`.
#[derive(Debug, PartialEq)]
pub struct Decision {
    pub ok: bool,
    pub retry_after: Option<f64>,
    pub remaining: f64,
    pub reset_after: f64,
    pub granted: f64,
}

/// The shards one call looks at, their committed states (fresh when never written) and
/// whether each row exists.
struct Looked {
    shards: Vec<i32>,
    states: Vec<State>,
    exists: Vec<bool>,
}

fn slot<'a>(req: &Request<'a>, shard: i32) -> Slot<'a> {
    Slot { name: req.name, key: req.key, shard }
}

fn fresh(req: &Request<'_>, config: &Config, now: f64) -> State {
    let phase = bucket::phase_fraction(req.name, req.key) * config.period;
    bucket::fresh_state(config, now, phase.floor())
}

/// One random shard, or two distinct ones from `MIN_CHOOSE_TWO` shards up.
fn pick_shards(shards: u32, avoid: &[i32]) -> Vec<i32> {
    let candidates: Vec<i32> = (0..shards as i32).filter(|s| !avoid.contains(s)).collect();
    let pool = if candidates.is_empty() { (0..shards as i32).collect() } else { candidates };
    let want = if shards >= MIN_CHOOSE_TWO { 2 } else { 1 }.min(pool.len());
    sample(&mut rand::thread_rng(), pool.len(), want).into_iter().map(|i| pool[i]).collect()
}

fn look(client: &SpiClient<'_>, req: &Request<'_>, per_shard: &Config, shards: Vec<i32>, now: f64) -> Looked {
    let found: Vec<Option<State>> = shards.iter().map(|s| storage::read(client, slot(req, *s))).collect();
    Looked {
        states: found.iter().map(|f| f.unwrap_or_else(|| fresh(req, per_shard, now))).collect(),
        exists: found.iter().map(Option::is_some).collect(),
        shards,
    }
}

fn decision(outcome: &Outcome, config: &Config, per_shard: &Config, count: f64, now: f64) -> Decision {
    // Sharded limits report an estimate from the shards looked at, scaled to all shards.
    let looked = outcome.after.len() as f64;
    let total: f64 = outcome.after.iter().map(|(s, _)| s.value).sum();
    let reset_after = outcome
        .after
        .iter()
        .map(|(s, _)| bucket::reset_after(*s, per_shard, now))
        .fold(0.0, f64::max);
    Decision {
        ok: outcome.ok,
        retry_after: outcome.retry_after,
        remaining: total * f64::from(config.shards) / looked,
        reset_after,
        granted: if outcome.ok { count } else { 0.0 },
    }
}

/// Answer without writing or locking anything (`check_rate_limit`).
pub fn check(client: &SpiClient<'_>, req: &Request<'_>, config: &Config) -> Decision {
    let per_shard = config.per_shard();
    let now = clock::now_ms();
    let looked = look(client, req, &per_shard, pick_shards(config.shards, &[]), now);
    let outcome = bucket::plan(&looked.states, &per_shard, now, req.count, req.reserve);
    decision(&outcome, config, &per_shard, req.count, now)
}

/// Consume (`rate_limit`).
pub fn consume(client: &SpiClient<'_>, req: &Request<'_>, config: &Config) -> Decision {
    let per_shard = config.per_shard();
    let mut busy: Vec<i32> = Vec::new();
    for round in 0..=SKIP_LOCKED_ROUNDS {
        let now = clock::now_ms();
        let looked = look(client, req, &per_shard, pick_shards(config.shards, &busy), now);
        let outcome = bucket::plan(&looked.states, &per_shard, now, req.count, req.reserve);
        if !outcome.ok {
            return decision(&outcome, config, &per_shard, req.count, now);
        }
        let taking: Vec<usize> = (0..looked.shards.len()).filter(|i| outcome.after[*i].1).collect();
        let wait = round == SKIP_LOCKED_ROUNDS;
        match lock_all(client, req, &per_shard, &looked, &taking, wait) {
            Some(locked) => return apply(client, req, config, &per_shard, &looked, &taking, locked),
            None => busy.extend(taking.iter().map(|i| looked.shards[*i])),
        }
    }
    unreachable!("the last round waits for its locks")
}

/// Lock the rows of the shards at `taking` (ascending shard order, so two waiting
/// transactions never hold each other's next shard), creating missing ones. Without
/// `wait`, gives up and returns `None` as soon as one is held by another transaction.
fn lock_all(
    client: &SpiClient<'_>,
    req: &Request<'_>,
    per_shard: &Config,
    looked: &Looked,
    taking: &[usize],
    wait: bool,
) -> Option<Vec<State>> {
    let mut order = taking.to_vec();
    order.sort_by_key(|i| looked.shards[*i]);
    let mut locked = vec![State { value: 0.0, ts: 0.0 }; looked.shards.len()];
    for i in order {
        let slot = slot(req, looked.shards[i]);
        locked[i] = loop {
            if let Some(state) = storage::lock(client, slot, !wait) {
                break state;
            }
            if looked.exists[i] && !wait {
                return None;
            }
            // Missing (never written, or reset meanwhile): create it full, then lock it. A
            // concurrent creator wins the race harmlessly; the next lock finds its row.
            let created = fresh(req, per_shard, clock::now_ms());
            if storage::insert(client, slot, created) {
                break created;
            }
        };
    }
    Some(taking.iter().map(|i| locked[*i]).collect())
}

/// Decide again on the locked rows with the clock read after locking, and write.
fn apply(
    client: &SpiClient<'_>,
    req: &Request<'_>,
    config: &Config,
    per_shard: &Config,
    looked: &Looked,
    taking: &[usize],
    locked: Vec<State>,
) -> Decision {
    let now = clock::now_ms();
    let outcome = bucket::plan(&locked, per_shard, now, req.count, req.reserve);
    if outcome.ok {
        for (&i, (state, changed)) in taking.iter().zip(&outcome.after) {
            if *changed {
                storage::update(client, slot(req, looked.shards[i]), *state);
            }
        }
    }
    decision(&outcome, config, per_shard, req.count, now)
}

/// The stored state of the fullest of `sample` random shards, as `rate_limit_value` reports it.
pub fn value(client: &SpiClient<'_>, req: &Request<'_>, config: &Config, sample_shards: u32) -> (State, i32) {
    let per_shard = config.per_shard();
    let now = clock::now_ms();
    let n = sample_shards.clamp(1, config.shards) as usize;
    let shards: Vec<i32> = sample(&mut rand::thread_rng(), config.shards as usize, n)
        .into_iter()
        .map(|s| s as i32)
        .collect();
    let looked = look(client, req, &per_shard, shards, now);
    // Compare as of now, so a shard that has since refilled counts as fuller.
    let fullest = (0..looked.shards.len())
        .max_by(|a, b| {
            let value_now = |i: usize| bucket::check(looked.states[i], &per_shard, now, 0.0, false).value;
            value_now(*a).total_cmp(&value_now(*b))
        })
        .unwrap_or(0);
    (looked.states[fullest], looked.shards[fullest])
}
