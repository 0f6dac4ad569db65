//! Concurrency limits (docs/semantics.md, "Concurrency limits"): a call takes `count` of the
//! `rate` slots of (name, key) or is denied. A slot is held by a transaction (its lock, until
//! the transaction ends) or by a lease (a row of `rate_limiter.leases`, until it expires or
//! is released). The search of one key's slots is one at a time: under it, a lock free is a
//! slot free unless a lease holds it, and the leases are read after the locks are taken,
//! so a lease committed meanwhile is seen.

use std::collections::{BTreeMap, BTreeSet};

use crate::bucket::concurrency::{self, Held};
use crate::bucket::Config;
use crate::call::{Decision, Reason, Request};
use crate::clock;
use crate::config;
use crate::error::Error;
use crate::storage::leases::{self, LeaseId, Leased};
use crate::storage::held_locks::{self, HeldLock};
use crate::storage::slots::{Slots, Tried};
use crate::storage::{self, stored_name};

/// How the slots a call takes are held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Hold {
    /// Until the caller's transaction ends.
    Transaction,
    /// Until this many ms from now, or an earlier `release`.
    Lease(f64),
}

/// What one search of the slots found and took.
struct Found {
    taken: Vec<u32>,
    leased: BTreeMap<u32, Leased>,
    /// Slots whose lock a transaction holds (this one among them).
    locked: BTreeSet<u32>,
}

impl Found {
    fn held(&self) -> Held {
        let ends = || self.leased.values().map(|l| l.expires);
        Held {
            slots: self.leased.keys().chain(&self.locked).collect::<BTreeSet<_>>().len() as u32,
            by_transactions: self.locked.iter().filter(|s| !self.leased.contains_key(s)).count() as u32,
            soonest_lease_end: ends().reduce(f64::min),
            latest_lease_end: ends().reduce(f64::max),
        }
    }
}

/// Probe every slot of `slots`, taking up to `want` free ones, under the search lock.
///
/// Under it no other call takes a slot or makes a lease, so what is free stays free, and
/// leases can only end, or appear where their transaction held the lock as this began. Each
/// pass reads the leases after its takes; the search ends when that read finds no lease on a
/// slot it took and no slot it has not judged since: every slot is then leased, locked by a
/// transaction, taken, or free.
fn search(slots: &Slots, name: &str, req: &Request<'_>, capacity: u32, want: usize, now: f64) -> Found {
    let unexpired = || leases::unexpired(name, req.key, now).into_iter().map(|l| (l.slot, l)).collect();
    let mut found = Found { taken: Vec::new(), leased: unexpired(), locked: BTreeSet::new() };
    loop {
        for slot in 0..capacity {
            pgrx::check_for_interrupts!();
            if found.leased.contains_key(&slot) || found.locked.contains(&slot) || found.taken.contains(&slot) {
                continue;
            }
            match slots.try_take(slot) {
                Tried::Taken if found.taken.len() < want => found.taken.push(slot),
                Tried::Taken => slots.give_back(slot),
                Tried::Ours | Tried::Theirs => {
                    found.locked.insert(slot);
                }
            }
        }
        // A lease whose transaction committed after the first read and before a take holds
        // that slot: read again now that the locks are ours.
        let before: BTreeSet<u32> = found.leased.keys().copied().collect();
        found.leased = unexpired();
        let lost: Vec<u32> = found.taken.iter().copied().filter(|s| found.leased.contains_key(s)).collect();
        for slot in &lost {
            slots.give_back(*slot);
        }
        found.taken.retain(|s| !lost.contains(s));
        // Slots whose lease ended since the last read were never tried.
        let ended = before.iter().any(|s| !found.leased.contains_key(s) && !found.locked.contains(s));
        if lost.is_empty() && (found.taken.len() == want || !ended) {
            return found;
        }
    }
}

fn decision(req: &Request<'_>, config: &Config, found: &Found, took: bool, now: f64) -> Decision {
    let a = concurrency::answer(config.rate, config.period, &found.held(), req.count, took, now);
    Decision {
        ok: a.ok,
        retry_after: a.retry_after,
        remaining: a.remaining,
        reset_after: a.reset_after,
        granted: if took { req.count } else { 0.0 },
        reason: (!a.ok).then_some(Reason::Exhausted),
        limited_by: (!a.ok).then(|| req.name.to_owned()),
    }
}

/// Refused (0A000) where the leases are a publisher's (`Error::SlotsOnSubscriber`).
fn not_on_a_subscriber() {
    if leases::subscribed() {
        Error::SlotsOnSubscriber.raise()
    }
}

/// Refused (53400) when this transaction would hold more than
/// `rate_limiter.max_slots_per_transaction` slot locks with `asked` more: each is an entry
/// of the lock table every database shares.
fn within_slots_per_transaction(asked: usize) {
    let (held, max) = (held_locks::held(HeldLock::Slot), config::max_slots_per_transaction());
    let asked = u32::try_from(asked).unwrap_or(u32::MAX);
    if held.saturating_add(asked) > max {
        Error::SlotsPerTransaction { held, asked, max }.raise()
    }
}

/// Take `req.count` slots, held as `hold` says; with a lease, its id.
pub fn acquire(req: &Request<'_>, config: &Config, hold: Hold) -> (Decision, Option<LeaseId>) {
    // A standby's or a subscriber's slots are locks the primary never sees.
    storage::prevent_during_recovery(c"acquire");
    not_on_a_subscriber();
    let want = req.count as usize;
    within_slots_per_transaction(want);
    let name = stored_name(req.name, req.inline.as_ref());
    let slots = Slots::of(&name, req.key);
    let searching = slots.search();
    let now = clock::now_ms();
    let found = search(&slots, &name, req, config.rate as u32, want, now);
    // Leases above a lowered rate still hold (define waits for transactions to end).
    let fits = f64::from(found.held().slots) + req.count <= config.rate;
    if found.taken.len() < want || !fits {
        for slot in &found.taken {
            slots.give_back(*slot);
        }
        let untaken = Found { taken: Vec::new(), ..found };
        return (decision(req, config, &untaken, false, now), None);
    }
    // The slots taken are locked until the transaction ends: the lease is written without
    // keeping other searches waiting (the write may wait for a row another transaction
    // deleted).
    held_locks::count_held(HeldLock::Slot, found.taken.len() as u32);
    drop(searching);
    let lease = match hold {
        Hold::Lease(ms) if want > 0 => {
            let id: LeaseId = new_lease_id();
            leases::claim(&name, req.key, &found.taken, &id, now + ms);
            Some(id)
        }
        _ => None,
    };
    (decision(req, config, &found, true, now), lease)
}

/// Whether `req.count` slots are free, taking none.
pub fn check(req: &Request<'_>, config: &Config) -> Decision {
    let name = stored_name(req.name, req.inline.as_ref());
    let slots = Slots::of(&name, req.key);
    let _searching = slots.search();
    let now = clock::now_ms();
    decision(req, config, &search(&slots, &name, req, config.rate as u32, 0, now), false, now)
}

/// The slots free now, and now (`rate_limit_value`).
pub fn free(req: &Request<'_>, config: &Config) -> (f64, f64) {
    let d = check(&Request { count: 0.0, ..*req }, config);
    (d.remaining, clock::now_ms())
}

/// End the lease `id` of (name, key) before its time; whether it still held its slots.
pub fn release(name: &str, key: Option<&str>, id: &LeaseId) -> bool {
    not_on_a_subscriber();
    leases::release(name, key, id, clock::now_ms())
}

/// Move the end of the lease `id` of (name, key) to `ms` from now, if it has not ended;
/// whether it was moved. Its slots are locked (waited for, in slot order) until the
/// transaction ends, so that no call takes them as the old end passes before this commits;
/// the lease is judged after that, by the clock then.
pub fn renew(name: &str, key: Option<&str>, id: &LeaseId, ms: f64) -> bool {
    not_on_a_subscriber();
    let Some(stored) = leases::lease_name(name, key, id) else { return false };
    let slots = Slots::of(&stored, key);
    let mine = |now: f64| leases::of_lease(&stored, key, id, now);
    let mut held: Vec<u32> = mine(clock::now_ms()).iter().map(|l| l.slot).collect();
    held.sort_unstable();
    if held.is_empty() {
        return false;
    }
    within_slots_per_transaction(held.len());
    for slot in &held {
        slots.wait_for(*slot);
    }
    held_locks::count_held(HeldLock::Slot, held.len() as u32);
    let now = clock::now_ms();
    let still: Vec<u32> = mine(now).iter().map(|l| l.slot).collect();
    still.len() == held.len() && leases::extend(&stored, key, id, now + ms, now) == held.len()
}

/// 16 bytes from a generator seeded by the operating system, as a version 4 UUID: a
/// lease's id is what lets a caller end it, so no one may guess another's.
fn new_lease_id() -> LeaseId {
    let mut id: LeaseId = rand::random();
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}
