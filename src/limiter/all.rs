//! Several limits decided at once (`rate_limit_all`): all are taken or none.
//!
//! Each request is read and decided as a single call is, without locks, and a denial
//! returns there. Otherwise every row to be taken from is locked in one global order (key,
//! name, config, then a limit's shards in ascending order, as a single call locks its own:
//! `Slot::order_key`), so that calls naming the same limits in another order queue instead
//! of deadlocking; then every durable request is decided again on its
//! locked rows with the clock read after locking, memory requests are taken (and taken back
//! if one is denied), and all are written or none.

use crate::bucket::{self, Config};
use crate::clock;
use crate::storage::StateTable;

use super::rows::{lock_one, look, pick_shards, queueing_pool, slot, starting};
use super::store::Store;
use super::{held_shards, in_flight, listed_decision, memory, Decision, Request};
use crate::lists::listed;

/// One request of the call, with its config.
pub struct Part<'a> {
    pub req: Request<'a>,
    pub config: Config,
}

/// What `decide_all` answers.
pub struct Decided {
    /// The decision for all parts.
    pub all: Decision,
    /// The part that limits it (on a denial, the one that waits longest).
    pub limiting: usize,
    /// Each part's own decision; empty when a block denied the call before any was made.
    /// An allowed part's is ok with reason `allowed`, and plays no part in `all`.
    pub parts: Vec<Decision>,
}

/// Before a consuming `rate_limit_all` opens its table for writing: a memory part whose key
/// is counted in its row (it found no room in shared memory) is decided as a durable part;
/// the others' entries are kept for them until `unpin_memory_parts`.
pub fn place_memory_parts(parts: &mut [Part<'_>]) {
    for part in parts.iter_mut().filter(|p| Store::of(&p.config) == Store::Memory) {
        if listed(&part.req).is_none() && memory::counted_in_row(&part.req, &part.config) {
            part.config.durable = true;
        }
    }
}

/// The entries `place_memory_parts` kept may be given away again (if an error comes first,
/// when the transaction ends: `in_flight`).
pub fn unpin_memory_parts() {
    in_flight::unpin_all();
}

pub fn decide_all(table: &StateTable, parts: &[Part<'_>], consume: bool) -> Decided {
    // A blocked request denies all; an allowed one is ok and takes no further part; neither
    // has its state read.
    let mut answered: Vec<Option<Decision>> =
        parts.iter().map(|p| listed(&p.req).map(|l| listed_decision(&p.req, l, p.config.capacity))).collect();
    let blocked: Vec<usize> = (0..parts.len()).filter(|i| answered[*i].as_ref().is_some_and(|d| !d.ok)).collect();
    if !blocked.is_empty() {
        let denials: Vec<Decision> = blocked.iter().map(|i| answered[*i].take().expect("blocked")).collect();
        let (all, j) = combine(&denials);
        return Decided { all, limiting: blocked[j], parts: Vec::new() };
    }
    let metered: Vec<usize> = (0..parts.len()).filter(|i| answered[*i].is_none()).collect();
    if metered.is_empty() {
        return all_decided(answered);
    }
    let decided_metered = decide_metered(table, &metered.iter().map(|i| &parts[*i]).collect::<Vec<_>>(), consume);
    for (i, d) in metered.iter().zip(decided_metered.parts) {
        answered[*i] = Some(d);
    }
    Decided {
        all: decided_metered.all,
        limiting: metered[decided_metered.limiting],
        parts: answered.into_iter().map(|d| d.expect("decided")).collect(),
    }
}

/// `decide_all` for requests that are neither blocked nor allowed: durable parts' rows are
/// locked and decided again first; then memory parts are taken one by one, and taken back
/// at once if one is denied (as a rolled-back savepoint gives them back); only when all
/// are granted are the durable rows written.
fn decide_metered(table: &StateTable, parts: &[&Part<'_>], consume: bool) -> Decided {
    let now = clock::now_ms();
    let durable: Vec<usize> = (0..parts.len()).filter(|p| parts[*p].config.durable).collect();
    let looked: Vec<_> = durable
        .iter()
        .map(|&p| {
            // A consuming call queues for its locks: only above the shards of the key this
            // transaction holds (rows.rs `waitable`). A check locks nothing.
            let pool = if consume {
                queueing_pool(&parts[p].req, &parts[p].config)
            } else {
                (0..parts[p].config.shards as i32).collect()
            };
            look(table, &parts[p].req, pick_shards(parts[p].config.shards, &pool, &[]))
        })
        .collect();
    let durable_decisions = |outcomes: &[bucket::Outcome], decisions: &mut [Option<Decision>]| {
        for (&p, o) in durable.iter().zip(outcomes) {
            decisions[p] = Some(o.decision(parts[p].req.name));
        }
    };
    let outcomes: Vec<_> = durable
        .iter()
        .zip(&looked)
        .map(|(&p, l)| {
            let (req, config) = (&parts[p].req, &parts[p].config);
            bucket::plan(&l.states(req, config, now), config, now, req.count, req.reserve)
        })
        .collect();
    let mut decisions: Vec<Option<Decision>> = (0..parts.len())
        .map(|p| (!parts[p].config.durable).then(|| memory::check(&parts[p].req, &parts[p].config)))
        .collect();
    durable_decisions(&outcomes, &mut decisions);
    if !consume || decisions.iter().flatten().any(|d| !d.ok) {
        return all_decided(decisions);
    }

    // (durable part, looked-at shard) of every row to take from, in the global order.
    let mut order: Vec<(usize, usize)> = outcomes
        .iter()
        .enumerate()
        .flat_map(|(p, o)| (0..o.after.len()).filter(move |i| o.after[*i].1).map(move |i| (p, i)))
        .collect();
    let slot_of = |p: usize, i: usize| slot(&parts[durable[p]].req, looked[p].shards[i]);
    order.sort_by(|a, b| slot_of(a.0, a.1).order_key().cmp(&slot_of(b.0, b.1).order_key()));
    let mut locked = vec![Vec::new(); durable.len()];
    for &(p, i) in &order {
        let part = parts[durable[p]];
        let shard = looked[p].shards[i];
        let row = lock_one(table, slot_of(p, i), looked[p].rows[i].clone(), true, &|| starting(table, &part.req, &part.config, shard, clock::now_ms()))
            .expect("a waiting lock is always obtained");
        held_shards::note(&part.req, shard, part.config.shards);
        locked[p].push((i, row));
    }
    let now = clock::now_ms();
    let outcomes: Vec<_> = durable
        .iter()
        .zip(&mut locked)
        .map(|(&p, rows)| {
            rows.sort_by_key(|(i, _)| *i);
            let states: Vec<_> = rows.iter().map(|(_, r)| r.state.clone()).collect();
            bucket::plan(&states, &parts[p].config, now, parts[p].req.count, parts[p].req.reserve)
        })
        .collect();
    durable_decisions(&outcomes, &mut decisions);
    if outcomes.iter().any(|o| !o.ok) {
        return all_decided(decisions);
    }
    let mark = in_flight::mark();
    for p in (0..parts.len()).filter(|p| !parts[*p].config.durable) {
        let d = memory::consume_to_take_back(&parts[p].req, &parts[p].config);
        let denied = !d.ok;
        decisions[p] = Some(d);
        if denied {
            in_flight::take_back_since(mark);
            return all_decided(decisions);
        }
    }
    for (p, (o, rows)) in outcomes.iter().zip(&locked).enumerate() {
        for (j, (i, row)) in rows.iter().enumerate() {
            let (state, changed) = &o.after[j];
            if *changed {
                table.write_locked(row, slot_of(p, *i), state, o.expires(j));
            }
        }
    }
    all_decided(decisions)
}

/// `decided`, once every part has its decision.
fn all_decided(decisions: Vec<Option<Decision>>) -> Decided {
    decided(decisions.into_iter().map(|d| d.expect("decided")).collect())
}

fn decided(parts: Vec<Decision>) -> Decided {
    let (all, limiting) = combine(&parts);
    Decided { all, limiting, parts }
}

/// One decision for all: ok only if every one is; the largest wait and reset, the least
/// remaining and granted; a denial names the request that waits longest.
fn combine(decisions: &[Decision]) -> (Decision, usize) {
    let ok = decisions.iter().all(|d| d.ok);
    // A denial without a retry_after (an indefinite block) waits longest of all.
    let wait = |d: &Decision| d.retry_after.unwrap_or(if d.ok { 0.0 } else { f64::INFINITY });
    let (index, limiting) = decisions
        .iter()
        .enumerate()
        .filter(|(_, d)| d.ok == ok)
        .max_by(|(_, a), (_, b)| wait(a).total_cmp(&wait(b)))
        .expect("at least one request");
    let combined = Decision {
        ok,
        retry_after: if ok {
            decisions.iter().filter_map(|d| d.retry_after).reduce(f64::max)
        } else {
            limiting.retry_after
        },
        // When none is taken, a request that would pass still has what it would have taken.
        remaining: decisions
            .iter()
            .map(|d| if ok { d.remaining } else { d.remaining + d.granted })
            .fold(f64::INFINITY, f64::min),
        reset_after: decisions.iter().map(|d| d.reset_after).fold(0.0, f64::max),
        granted: if ok { decisions.iter().map(|d| d.granted).fold(f64::INFINITY, f64::min) } else { 0.0 },
        reason: limiting.reason,
        limited_by: limiting.limited_by.clone(),
    };
    (combined, index)
}

#[cfg(test)]
mod tests {
    use super::combine;
    use crate::call::{Decision, Reason};

    fn d(ok: bool, retry_after: Option<f64>, remaining: f64, granted: f64, by: &str) -> Decision {
        Decision {
            ok,
            retry_after,
            remaining,
            reset_after: remaining * 10.0,
            granted,
            reason: (!ok).then_some(Reason::Exhausted),
            limited_by: (!ok).then(|| by.to_owned()),
        }
    }

    #[test]
    fn all_granted_takes_the_least_remaining_and_the_longest_reservation_wait() {
        let (all, _) = combine(&[d(true, None, 4.0, 1.0, "a"), d(true, Some(500.0), 2.0, 1.0, "b")]);
        assert!(all.ok);
        assert_eq!((all.retry_after, all.remaining, all.granted, all.reset_after), (Some(500.0), 2.0, 1.0, 40.0));
        assert_eq!((all.reason, all.limited_by), (None, None));
    }

    #[test]
    fn a_denial_names_the_request_that_waits_longest_and_takes_nothing() {
        let parts = [d(true, None, 3.0, 1.0, "a"), d(false, Some(100.0), 0.0, 0.0, "b"), d(false, Some(900.0), 0.0, 0.0, "c")];
        let (all, limiting) = combine(&parts);
        assert_eq!(limiting, 2);
        assert_eq!((all.ok, all.retry_after, all.granted), (false, Some(900.0), 0.0));
        assert_eq!((all.reason, all.limited_by.as_deref()), (Some(Reason::Exhausted), Some("c")));
        // What the granted request would have taken is still there.
        assert_eq!(all.remaining, 0.0);
        let (all, _) = combine(&[d(true, None, 3.0, 1.0, "a"), d(false, Some(1.0), 5.0, 0.0, "b")]);
        assert_eq!(all.remaining, 4.0, "3 left after taking 1, so 4 while nothing is taken");
    }

    #[test]
    fn an_indefinite_block_waits_longest_of_all() {
        let blocked = Decision { reason: Some(Reason::Blocked), ..d(false, None, 0.0, 0.0, "blocked") };
        let (all, limiting) = combine(&[d(false, Some(1e9), 0.0, 0.0, "slow"), blocked]);
        assert_eq!((limiting, all.retry_after, all.reason), (1, None, Some(Reason::Blocked)));
    }
}
