//! Durable limits' rows of `rate_limiter.state`: which shards to look at, reading them,
//! locking and writing what the bucket math decided.
//!
//! A call first reads the state as of its snapshot without locking. If that already denies,
//! it returns without taking a lock or writing. When it takes from one row, it writes that
//! row straight away, and only when a transaction that committed meanwhile changed the row
//! does it lock the newest version, read the clock again and decide again. Taking from two
//! shards locks both first (in shard order) and then writes.

use pgrx::check_for_interrupts;
use rand::seq::index::sample;

use std::time::{Duration, Instant};

use crate::bucket::{self, Config, OnLockTimeout, Outcome, State, MIN_CHOOSE_TWO};
use crate::call::{Decision, Reason, Request};
use crate::clock::{self, sleep_ms};
use crate::storage::{Created, Locked, Owner, Row, Slot, StateTable, Written};

use super::held_shards;


/// How many times a call re-picks shards when those it chose are locked by other
/// transactions, before it queues for its choice.
const SKIP_LOCKED_ROUNDS: usize = 3;

/// The shards one call looks at, their rows when they exist and the states they start from.
pub(super) struct Looked {
    pub shards: Vec<i32>,
    pub rows: Vec<Option<Row>>,
    /// A shard's row's state; for a missing row under an inline config, that of the row
    /// 0.4.0 kept for every inline config of (name, key), while one is left (it expires, and
    /// nothing writes it any more); `None`: fresh.
    pub stored: Vec<Option<State>>,
}

impl Looked {
    /// Each shard's state as of `now`: stored, else fresh.
    pub fn states(&self, req: &Request<'_>, config: &Config, now: f64) -> Vec<State> {
        let fresh = || bucket::fresh(config, req.name, req.key, now);
        self.stored.iter().map(|s| s.clone().unwrap_or_else(fresh)).collect()
    }
}

pub(super) fn slot<'a>(req: &Request<'a>, shard: i32) -> Slot<'a> {
    let owner = req.inline.map_or(Owner::Named, Owner::Inline);
    Slot { name: req.name, key: req.key, shard, owner }
}

/// The state a missing row starts from when it is not fresh: for an inline config, that of
/// the row 0.4.0 kept for every inline config of (name, key), while one is left.
fn shared_inline(table: &StateTable, req: &Request<'_>, shard: i32) -> Option<State> {
    req.inline?;
    table.read(Slot { owner: Owner::SharedInline, ..slot(req, shard) }).map(|row| row.state)
}

/// What a missing row of `shard` is created with: the state it starts from as of `now`, and
/// when that expires.
pub(super) fn starting(table: &StateTable, req: &Request<'_>, config: &Config, shard: i32, now: f64) -> (State, f64) {
    let state = shared_inline(table, req, shard).unwrap_or_else(|| bucket::fresh(config, req.name, req.key, now));
    let expires = bucket::expires(&state, config);
    (state, expires)
}

/// One random shard, or two distinct ones from `MIN_CHOOSE_TWO` shards up, out of `pool`
/// and, when that leaves enough, not out of `avoid`.
pub(super) fn pick_shards(shards: u32, pool: &[i32], avoid: &[i32]) -> Vec<i32> {
    if shards == 1 {
        return vec![0];
    }
    let preferred: Vec<i32> = pool.iter().copied().filter(|s| !avoid.contains(s)).collect();
    let want = if shards >= MIN_CHOOSE_TWO { 2 } else { 1 };
    let pool = if preferred.len() >= want.min(pool.len()) { preferred } else { pool.to_vec() };
    let want = want.min(pool.len());
    sample(&mut rand::thread_rng(), pool.len(), want).into_iter().map(|i| pool[i]).collect()
}

/// The shards a call may queue for: those its transaction already holds (from this call's
/// rounds that gave up, and earlier calls: `held_shards`) and those above all of them.
/// Queueing only upwards, no two transactions can wait for each other on one key's shards.
fn waitable(shards: u32, held: &[i32]) -> Vec<i32> {
    match held.iter().max() {
        None => (0..shards as i32).collect(),
        Some(&top) => held.iter().copied().chain(top + 1..shards as i32).collect(),
    }
}

/// The shards of `req`'s key a call that will queue for its locks may pick from.
pub(super) fn queueing_pool(req: &Request<'_>, config: &Config) -> Vec<i32> {
    waitable(config.shards, &held_of(req, config))
}

/// The shards of `req`'s key this transaction holds that `config` has (a limit redefined with
/// fewer shards in the transaction keeps rows above them, which no call takes from).
fn held_of(req: &Request<'_>, config: &Config) -> Vec<i32> {
    held_shards::of(req).into_iter().filter(|s| *s < config.shards as i32).collect()
}

pub(super) fn look(table: &StateTable, req: &Request<'_>, shards: Vec<i32>) -> Looked {
    let rows: Vec<Option<Row>> = shards.iter().map(|s| table.read(slot(req, *s))).collect();
    Looked {
        stored: rows.iter().zip(&shards).map(|(r, s)| r.as_ref().map_or_else(|| shared_inline(table, req, *s), |r| Some(r.state.clone()))).collect(),
        rows,
        shards,
    }
}

/// Answer without writing or locking anything (`check_rate_limit`): the shards' rows as of
/// the snapshot.
pub fn check(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    let all: Vec<i32> = (0..config.shards as i32).collect();
    let looked = look(table, req, pick_shards(config.shards, &all, &[]));
    let now = clock::now_ms();
    let states = looked.states(req, config, now);
    bucket::plan(&states, config, now, req.count, req.reserve).decision(req.name)
}

/// What a writing call does to the states of the shards it looked at, as of an instant.
type Plan<'p> = &'p dyn Fn(&[State], f64) -> Outcome;

/// Take `req.count` (`rate_limit`).
pub fn consume(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    write(table, req, config, &|states, now| remarked(states, bucket::plan(states, config, now, req.count, req.reserve)))
}

/// `outcome`, with every shard it leaves unchanged whose token bucket's or fixed window's
/// level was written under another capacity (numbers changed since) to be written all the same: a denial then stores the
/// level as it reads it now, and an expiry under the numbers in force, so that prune() keeps
/// the row while the key still owes what it used.
fn remarked(states: &[State], mut outcome: Outcome) -> Outcome {
    for (before, (after, write)) in states.iter().zip(outcome.after.iter_mut()) {
        let (was, is) = (before.written_under(), after.written_under());
        if was.is_some() && is.is_some() && was != is {
            *write = true;
        }
    }
    outcome
}

/// Give `req.count` back (`credit`), to the emptiest shard looked at; `config` has no
/// `lock_timeout` (a give-back is never dropped).
pub fn credit(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    write(table, req, config, &|states, now| bucket::plan_credit(states, config, now, req.count))
}

/// Plan on the shards' states and write what the plan changed: the write path that
/// consuming and crediting share.
fn write(table: &StateTable, req: &Request<'_>, config: &Config, plan: Plan<'_>) -> Decision {
    // Shards other transactions were seen holding, and shards this transaction holds
    // (earlier calls', and this call's rounds that gave up: kept until the transaction ends).
    let mut busy: Vec<i32> = Vec::new();
    let mut held: Vec<i32> = if config.shards > 1 { held_of(req, config) } else { Vec::new() };
    // With a lock_timeout, a call that must wait tries without waiting until the deadline
    // instead, so that giving up aborts nothing and leaves no lock queued.
    let deadline = config.lock_timeout.map(|ms| (Instant::now() + Duration::from_secs_f64(ms / 1000.0), ms));
    let mut pause = LOCK_POLL_FIRST_MS;
    let mut round = 0;
    loop {
        check_for_interrupts!();
        // One shard has no other to turn to: queue for it at once.
        let must_wait = round >= SKIP_LOCKED_ROUNDS || config.shards == 1;
        let wait = must_wait && deadline.is_none();
        let pool = if must_wait { waitable(config.shards, &held) } else { (0..config.shards as i32).collect() };
        let now = clock::now_ms();
        let looked = look(table, req, pick_shards(config.shards, &pool, &busy));
        let outcome = plan(&looked.states(req, config, now), now);
        // What the call changes: nothing when denied, except in the penalize mode.
        let taking: Vec<usize> = (0..looked.shards.len()).filter(|i| outcome.after[*i].1).collect();
        if taking.is_empty() {
            return outcome.decision(req.name);
        }
        let mut try_locking = true;
        if let [i] = taking[..] {
            // The common case, one row to write: write it without locking it first.
            let slot = slot(req, looked.shards[i]);
            let state = &outcome.after[i].0;
            let expires = outcome.expires(i);
            let written = match &looked.rows[i] {
                Some(row) => table.update(row, slot, state, expires, wait),
                None => match table.create(slot, state, expires, wait) {
                    Created::Done(_) => Written::Done,
                    Created::Exists(_) => Written::Moved,
                    Created::Busy => Written::Busy,
                },
            };
            match written {
                Written::Done => {
                    held_shards::note(req, slot.shard, config.shards);
                    return outcome.decision(req.name);
                }
                Written::Busy => {
                    busy.push(slot.shard);
                    try_locking = false;
                }
                Written::Moved => {} // decide again on the newest version, locked
            }
        }
        if try_locking {
            let starting = |shard| starting(table, req, config, shard, clock::now_ms());
            match lock_all(table, req, config.shards, &looked, &taking, wait, &mut held, &starting) {
                Some(locked) => return apply(table, req, &looked, &taking, locked, plan),
                None => busy.extend(taking.iter().map(|i| looked.shards[*i])),
            }
        }
        match deadline {
            Some((at, ms)) if must_wait => {
                if Instant::now() >= at {
                    return lock_timed_out(req, config, &outcome.decision(req.name), ms);
                }
                sleep_ms(pause.min(at.saturating_duration_since(Instant::now()).as_secs_f64() * 1000.0));
                pause = (pause * 2.0).min(LOCK_POLL_MAX_MS);
            }
            _ => round += 1,
        }
    }
}

/// A lock_timeout's first pause between tries, doubled up to the last.
const LOCK_POLL_FIRST_MS: f64 = 1.0;
const LOCK_POLL_MAX_MS: f64 = 20.0;

/// What a call whose row stayed locked past `lock_timeout` (`waited` ms) answers, by the
/// limit's policy: denied, to retry after as long again; or let through unmetered.
fn lock_timed_out(req: &Request<'_>, config: &Config, planned: &Decision, waited: f64) -> Decision {
    let allow = config.on_lock_timeout == OnLockTimeout::Allow;
    Decision {
        ok: allow,
        retry_after: (!allow).then_some(waited.max(1.0)),
        remaining: planned.remaining,
        reset_after: planned.reset_after,
        granted: 0.0,
        reason: Some(Reason::LockTimeout),
        limited_by: Some(req.name.to_owned()),
    }
}

/// Lock the rows of the shards at `taking` (of a limit of `shards` shards) in ascending shard
/// order, creating missing ones as `starting` a shard says, and note each in `held`. Without `wait`, gives up and returns
/// `None` as soon as one is held by another transaction.
#[allow(clippy::too_many_arguments)]
fn lock_all(
    table: &StateTable,
    req: &Request<'_>,
    shards: u32,
    looked: &Looked,
    taking: &[usize],
    wait: bool,
    held: &mut Vec<i32>,
    starting: &dyn Fn(i32) -> (State, f64),
) -> Option<Vec<Row>> {
    let mut order = taking.to_vec();
    order.sort_by_key(|i| looked.shards[*i]);
    let mut locked: Vec<Option<Row>> = vec![None; looked.shards.len()];
    for i in order {
        let slot = slot(req, looked.shards[i]);
        locked[i] = Some(lock_one(table, slot, looked.rows[i].clone(), wait, &|| starting(slot.shard))?);
        held_shards::note(req, slot.shard, shards);
        if !held.contains(&slot.shard) {
            held.push(slot.shard);
        }
    }
    Some(taking.iter().map(|i| locked[*i].take().expect("every taken shard was locked")).collect())
}

/// Lock the row of `slot` (`known` when it was read), creating it when missing with the
/// state and expiry `starting` gives; `None` when another transaction holds it (only without
/// `wait`).
pub(super) fn lock_one(
    table: &StateTable,
    slot: Slot<'_>,
    known: Option<Row>,
    wait: bool,
    starting: &dyn Fn() -> (State, f64),
) -> Option<Row> {
    let mut known = known;
    loop {
        check_for_interrupts!();
        match known {
            Some(row) => match table.lock(&row, wait) {
                Locked::Row(row) => return Some(row),
                Locked::Busy => return None,
                Locked::Gone => known = None,
            },
            // Missing (never written, or reset meanwhile): create it as it starts; ours
            // until commit. If a concurrent transaction created it first, lock theirs.
            None => {
                let (state, expires) = starting();
                match table.create(slot, &state, expires, wait) {
                    Created::Done(row) => return Some(row),
                    Created::Exists(row) => known = Some(row),
                    Created::Busy => return None,
                }
            }
        }
    }
}

/// Decide again on the locked rows with the clock read after locking, and write.
fn apply(table: &StateTable, req: &Request<'_>, looked: &Looked, taking: &[usize], locked: Vec<Row>, plan: Plan<'_>) -> Decision {
    let now = clock::now_ms();
    let states: Vec<State> = locked.iter().map(|r| r.state.clone()).collect();
    let outcome = plan(&states, now);
    for (j, (&i, row)) in taking.iter().zip(&locked).enumerate() {
        let (state, changed) = &outcome.after[j];
        if *changed {
            table.write_locked(row, slot(req, looked.shards[i]), state, outcome.expires(j));
        }
    }
    outcome.decision(req.name)
}

/// The stored state of the fullest of `sample` random shards, as `rate_limit_value` reports it.
pub fn value(table: &StateTable, req: &Request<'_>, config: &Config, sample_shards: u32) -> (State, i32) {
    let now = clock::now_ms();
    let n = sample_shards.clamp(1, config.shards) as usize;
    let shards: Vec<i32> = sample(&mut rand::thread_rng(), config.shards as usize, n)
        .into_iter()
        .map(|s| s as i32)
        .collect();
    let looked = look(table, req, shards);
    let mut states = looked.states(req, config, now);
    // Compare as of now, so a shard that has since refilled counts as fuller.
    let fullest = (0..looked.shards.len())
        .max_by(|a, b| {
            let value_now = |i: usize| bucket::available(&states[i], config, now);
            value_now(*a).total_cmp(&value_now(*b))
        })
        .unwrap_or(0);
    (states.swap_remove(fullest), looked.shards[fullest])
}

#[cfg(test)]
mod tests {
    use super::{pick_shards, MIN_CHOOSE_TWO};

    #[test]
    fn one_shard_is_always_shard_zero() {
        assert_eq!(pick_shards(1, &[0], &[]), vec![0]);
        assert_eq!(pick_shards(1, &[0], &[0]), vec![0]);
    }

    #[test]
    fn from_min_choose_two_shards_two_distinct_ones_are_picked_from_the_pool() {
        let pool: Vec<i32> = (0..8).collect();
        for _ in 0..200 {
            let two = pick_shards(8, &pool, &[]);
            assert_eq!(two.len(), 2);
            assert_ne!(two[0], two[1]);
            assert!(two.iter().all(|s| pool.contains(s)));
        }
        assert_eq!(pick_shards(MIN_CHOOSE_TWO - 1, &[0, 1], &[]).len(), 1, "below it, one");
    }

    #[test]
    fn busy_shards_are_avoided_while_enough_others_are_left() {
        let pool: Vec<i32> = (0..8).collect();
        for _ in 0..200 {
            let picked = pick_shards(8, &pool, &[0, 1, 2, 3, 4, 5]);
            assert!(picked.iter().all(|s| *s >= 6), "{picked:?}");
        }
        // One free shard is not enough for two: the whole pool is used again.
        let mut seen_busy = false;
        for _ in 0..200 {
            let picked = pick_shards(8, &pool, &[0, 1, 2, 3, 4, 5, 6]);
            assert_eq!(picked.len(), 2);
            seen_busy |= picked.iter().any(|s| *s < 7);
        }
        assert!(seen_busy);
    }
}
