//! The bucket math against the Convex component's own vectors, and properties over random
//! call sequences.

use super::*;
use crate::call::Reason;

const SECOND: f64 = 1_000.0;
const MINUTE: f64 = 60.0 * SECOND;
const HOUR: f64 = 60.0 * MINUTE;
pub(super) const NOW: f64 = 1_700_000_000_000.0;
/// The Convex component's kinds, whose vectors these are.
const KINDS: [Kind; 2] = [Kind::TokenBucket, Kind::FixedWindow];
pub(super) const ALL_KINDS: [Kind; 4] = [Kind::TokenBucket, Kind::FixedWindow, Kind::SlidingWindow, Kind::RollingWindow];

/// A limit of `kind` with every setting at its default; shared with the other kinds' tests.
pub(super) fn config(kind: Kind, rate: f64, period: f64) -> Config {
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
        hot: false,
        durable: true,
        enforce: true,
        calendar: None,
        split: false,
    }
}

fn at(value: f64, ts: f64) -> State {
    State::new(value, ts)
}

fn state_of(check: &Check) -> State {
    check.state()
}

#[test]
fn simple_success_and_failure() {
    for kind in KINDS {
        let c = config(kind, 1.0, SECOND);
        let ok = check(&at(1.0, NOW), &c, NOW, 1.0, false);
        assert!(ok.ok);
        assert_eq!(ok.value, 0.0);
        assert_eq!(ok.retry_after, None);
        let denied = check(&at(0.0, NOW), &c, NOW, 1.0, false);
        assert!(!denied.ok);
        assert_eq!(denied.retry_after, Some(SECOND));
        let owed = check(&at(-1.0, NOW), &c, NOW, 1.0, false);
        assert_eq!(owed.retry_after, Some(2.0 * SECOND));
    }
}

#[test]
fn burst_up_to_capacity() {
    for kind in KINDS {
        let c = Config { capacity: 3.0, ..config(kind, 1.0, SECOND) };
        let all = check(&at(3.0, NOW), &c, NOW, 3.0, false);
        assert!(all.ok);
        assert_eq!((all.value, all.retry_after), (0.0, None));
        let too_much = check(&at(3.0, NOW), &c, NOW, 4.0, false);
        assert!(!too_much.ok);
        assert_eq!((too_much.value, too_much.retry_after), (-1.0, Some(SECOND)));
    }
}

/// Convex: "retryAfter is accurate", 10 per minute.
#[test]
fn retry_after_is_accurate() {
    for kind in KINDS {
        let c = config(kind, 10.0, MINUTE);
        let one = check(&at(10.0, NOW), &c, NOW, 5.0, false);
        assert!(one.ok && one.retry_after.is_none());
        let later = if kind == Kind::TokenBucket { one.ts + 6.0 * SECOND } else { one.ts + MINUTE };
        let two = check(&state_of(&one), &c, later, 6.0, false);
        assert!(two.ok && two.retry_after.is_none());
        let expected = if kind == Kind::TokenBucket { 0.0 } else { 4.0 };
        assert_eq!(two.value, expected);
        let three = check(&state_of(&two), &c, later, 10.0, false);
        assert!(!three.ok);
        assert_eq!(three.retry_after, Some(MINUTE));
    }
}

/// The same vectors with 6 s between calls for both kinds, as the issue states them.
#[test]
fn six_seconds_later_fixed_window_keeps_its_window() {
    let c = config(Kind::FixedWindow, 10.0, MINUTE);
    let one = check(&at(10.0, NOW), &c, NOW, 5.0, false);
    let two = check(&state_of(&one), &c, NOW + 6.0 * SECOND, 6.0, false);
    assert!(!two.ok, "only 5 left in this window");
    assert_eq!(two.retry_after, Some(MINUTE - 6.0 * SECOND));
}

/// Convex: "retryAfter for reserved is accurate".
#[test]
fn retry_after_for_reserved_is_accurate() {
    for kind in KINDS {
        let c = config(kind, 10.0, MINUTE);
        let one = check(&at(10.0, NOW), &c, NOW, 5.0, false);
        let later = if kind == Kind::TokenBucket { one.ts + 6.0 * SECOND } else { one.ts + MINUTE };
        let two = check(&state_of(&one), &c, later, 16.0, true);
        assert!(two.ok);
        assert_eq!(two.retry_after, Some(MINUTE));
        let expected = if kind == Kind::TokenBucket { -10.0 } else { -6.0 };
        assert_eq!(two.value, expected);

        let three = check(&state_of(&two), &c, two.ts + 30.0 * SECOND, 5.0, true);
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
        let reserved = check(&at(0.0, NOW), &unbounded, NOW, 100.0, true);
        assert!(reserved.ok);
        let first_wait = reserved.retry_after.unwrap();
        assert!(first_wait > 0.0);
        let followup = check(&state_of(&reserved), &unbounded, NOW, 1.0, false);
        assert!(!followup.ok);
        assert!(followup.retry_after.unwrap() > first_wait);

        let bounded = Config { max_reserved: Some(1.0), ..config(kind, 1.0, HOUR) };
        let reserved = check(&at(1.0, NOW), &bounded, NOW, 2.0, true);
        assert!(reserved.ok);
        let followup = check(&state_of(&reserved), &bounded, NOW, 1.0, true);
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
        let years = check(&at(1.0, NOW), &c, NOW, 1e9, true);
        assert!(years.ok, "31 years of debt is still a reservation");
        let limit = storable_debt(&c, NOW);
        let at_limit = check(&at(c.capacity, NOW), &c, NOW, c.capacity + limit, true);
        assert!(at_limit.ok);
        let end = expires(&state_of(&at_limit), &c);
        assert!(end < END_OF_TIME_MS && NOW + at_limit.retry_after.unwrap() < END_OF_TIME_MS, "{kind:?}: {end}");
        let past = check(&at(c.capacity, NOW), &c, NOW, c.capacity + limit * 1.001, true);
        assert!(!past.ok, "{kind:?}: past the storable debt");
        let huge = check(&at(1.0, NOW), &c, NOW, 1e300, true);
        assert!(!huge.ok && huge.retry_after.unwrap().is_finite());
        let bounded = Config { max_reserved: Some(1e300), ..c };
        assert!(check(&at(1.0, NOW), &bounded, NOW, 1e300, true).ok, "an explicit max_reserved is the bound");
    }
}

#[test]
fn zero_max_reserved_allows_no_reservation() {
    let c = Config { max_reserved: Some(0.0), ..config(Kind::TokenBucket, 1.0, SECOND) };
    assert!(!check(&at(0.0, NOW), &c, NOW, 1.0, true).ok);
}

#[test]
fn token_bucket_refills_continuously_up_to_capacity() {
    let c = config(Kind::TokenBucket, 10.0, MINUTE);
    // Convex shared.test: 5 tokens, 30 s later, take 8 -> 2; take 15 -> -5 and wait 30 s.
    let s = at(5.0, NOW - 30.0 * SECOND);
    assert_eq!(check(&s, &c, NOW, 0.0, false).value, 10.0);
    assert_eq!(check(&s, &c, NOW, 8.0, false).value, 2.0);
    let over = check(&s, &c, NOW, 15.0, false);
    assert_eq!((over.value, over.retry_after), (-5.0, Some(30.0 * SECOND)));
    assert_eq!(over.ts, NOW);
}

#[test]
fn fixed_window_adds_rate_per_elapsed_window() {
    let c = config(Kind::FixedWindow, 10.0, MINUTE);
    let start = NOW - 30.0 * SECOND;
    let same = check(&at(5.0, start), &c, start + 45.0 * SECOND, 0.0, false);
    assert_eq!((same.value, same.ts), (5.0, start));
    let next = check(&at(5.0, start), &c, start + 90.0 * SECOND, 0.0, false);
    assert_eq!((next.value, next.ts), (10.0, start + MINUTE));
}

#[test]
fn a_clock_that_steps_back_refills_nothing() {
    for kind in KINDS {
        let c = config(kind, 10.0, MINUTE);
        let back = check(&at(2.0, NOW), &c, NOW - 10.0 * MINUTE, 1.0, false);
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
    let future = Config { start: Some(NOW + 10.0 * SECOND), ..fw };
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
    assert_eq!(reset_after(&at(10.0, NOW), &tb, NOW), 0.0);
    assert_eq!(reset_after(&at(4.0, NOW), &tb, NOW), 36.0 * SECOND);
    let fw = config(Kind::FixedWindow, 10.0, MINUTE);
    assert_eq!(reset_after(&at(4.0, NOW - 10.0 * SECOND), &fw, NOW), 50.0 * SECOND);
    assert_eq!(reset_after(&at(-6.0, NOW), &fw, NOW), 2.0 * MINUTE);
}

#[test]
fn impossible_counts_match_convex_messages() {
    let c = config(Kind::FixedWindow, 1.0, SECOND);
    assert_eq!(c.impossible_count(2.0, false).as_deref(), Some("1"));
    assert_eq!(c.impossible_count(1.0, false), None);
    assert_eq!(c.impossible_count(1e9, true), None, "unbounded reservations");
    let bounded = Config { max_reserved: Some(2.0), ..c };
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
    assert_eq!((s.rate, s.capacity, s.max_reserved, s.shards), (5.0, 10.0, Some(2.0), 1));
    assert_eq!(s.per_shard(), s, "a share is not split again");
}

/// What a call reports of a sharded limit is of the whole limit: the shards looked at,
/// scaled to all of them.
#[test]
fn a_sharded_decision_reports_the_whole_limit() {
    let c = Config { shards: 4, capacity: 40.0, ..config(Kind::TokenBucket, 40.0, 4.0 * SECOND) };
    let full = fresh_state(&c.per_shard(), NOW, 0.0);
    let outcome = plan(&[full.clone(), full.clone()], &c, NOW, 4.0, false);
    assert!(outcome.ok);
    assert_eq!(outcome.available.iter().sum::<f64>(), 16.0, "two shards of 10, 4 taken");
    let d = outcome.decision("api");
    assert_eq!((d.remaining, d.reset_after, d.granted), (32.0, 1600.0, 4.0), "scaled to 4 shards; the shard taken from refills 4 at 10 per 4 s");
    assert_eq!(d.limited_by, None);
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
            if pruned.as_ref().is_some_and(|s| expires(s, &c) <= prune_at) {
                pruned = None;
            }
            let count = f64::from(rng.gen_range(0..(c.capacity as u32 + 2)));
            let reserve = kind.can_reserve() && c.mode == Mode::All && rng.gen_bool(0.2);
            let call = |stored: &mut Option<State>| {
                let state = stored.clone().unwrap_or_else(|| fresh_state(&c, now, phase));
                let outcome = plan(std::slice::from_ref(&state), &c, now, count, reserve);
                if outcome.after[0].1 {
                    *stored = Some(outcome.after[0].0.clone());
                }
                let reset = reset_after(&outcome.after[0].0, &c, now);
                (outcome, reset)
            };
            assert_eq!(call(&mut kept), call(&mut pruned), "round {round}, {c:?}");
        }
    }
}

#[test]
fn expires_is_when_a_state_is_fresh_again() {
    let tb = config(Kind::TokenBucket, 10.0, MINUTE);
    assert_eq!(expires(&at(4.0, NOW), &tb), NOW + 36.0 * SECOND);
    assert_eq!(expires(&at(10.0, NOW), &tb), NOW);
    let owed = expires(&at(-10.0, NOW), &tb);
    assert_eq!(owed, NOW + 2.0 * MINUTE, "debts are paid first");
    let fw = config(Kind::FixedWindow, 10.0, MINUTE);
    assert_eq!(expires(&at(4.0, NOW), &fw), NOW + MINUTE);
    assert_eq!(expires(&at(-6.0, NOW), &fw), NOW + 2.0 * MINUTE);
    assert_eq!(expires(&at(10.0, NOW), &fw), NOW);
}

/// The vector: rate 10 per 60 s, windows from T0.
#[test]
fn sliding_window_vector() {
    let c = Config { start: Some(NOW), ..config(Kind::SlidingWindow, 10.0, MINUTE) };
    let mut state = fresh_state(&c, NOW + 30.0 * SECOND, 0.0);
    let mut call = |at: f64, count: f64| {
        let outcome = plan(std::slice::from_ref(&state), &c, at, count, false);
        if outcome.ok {
            state = outcome.after[0].0.clone();
        }
        (outcome.ok, outcome.available[0], outcome.retry_after)
    };
    assert_eq!(call(NOW + 30.0 * SECOND, 4.0), (true, 6.0, None));
    assert_eq!(call(NOW + 75.0 * SECOND, 5.0), (true, 2.0, None), "4 * 3/4 + 5 = 8 weigh");
    assert_eq!(call(NOW + 75.0 * SECOND, 2.0), (true, 0.0, None));
    let denied = call(NOW + 75.0 * SECOND, 1.0);
    assert_eq!((denied.0, denied.2), (false, Some(15.0 * SECOND)), "4 * 1/2 + 7 + 1 = 10 at T0 + 90 s");
    assert_eq!(call(NOW + 90.0 * SECOND, 1.0), (true, 0.0, None));
    assert_eq!(reset_after(&state, &c, NOW + 90.0 * SECOND), 90.0 * SECOND, "8 taken weigh until T0 + 180 s");
    assert_eq!(expires(&state, &c), NOW + 180.0 * SECOND);
}

/// Upstash floors the previous window's share and compares before adding the count:
/// at a quarter into a window after 10 of 10 were taken, it lets 3 through (floor(7.5) = 7
/// < 10), which makes 10.5 weigh. Here 2 pass and the third waits.
#[test]
fn sliding_window_never_lets_the_weight_exceed_the_rate() {
    let c = Config { start: Some(NOW), ..config(Kind::SlidingWindow, 10.0, MINUTE) };
    let full = plan(&[fresh_state(&c, NOW, 0.0)], &c, NOW, 10.0, false).after[0].0.clone();
    let quarter = NOW + 75.0 * SECOND;
    assert!(plan(std::slice::from_ref(&full), &c, quarter, 2.0, false).ok);
    let three = plan(std::slice::from_ref(&full), &c, quarter, 3.0, false);
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
            let outcome = plan(std::slice::from_ref(&state), &c, now, count, false);
            if outcome.ok {
                state = outcome.after[0].0.clone();
                assert!(outcome.available[0] >= -1e-9, "round {round}: {outcome:?}");
                continue;
            }
            let retry = outcome.retry_after.expect("a denial says when");
            assert!(retry > 0.0, "round {round}");
            assert!(plan(std::slice::from_ref(&state), &c, now + retry, count, false).ok, "round {round}: passes at retry_after");
            if retry > 1.0 {
                assert!(!plan(std::slice::from_ref(&state), &c, now + retry - 1.0, count, false).ok, "round {round}: not 1 ms earlier");
            }
        }
    }
}

#[test]
fn min_gap_spaces_granted_calls() {
    let c = Config { min_gap: Some(100.0), ..config(Kind::TokenBucket, 10.0, SECOND) };
    let first = plan(&[at(10.0, NOW)], &c, NOW, 1.0, false);
    assert!(first.ok);
    let state = first.after[0].0.clone();
    assert_eq!(state.granted_at, Some(NOW));
    let soon = plan(std::slice::from_ref(&state), &c, NOW + 40.0, 1.0, false);
    assert_eq!((soon.ok, soon.reason, soon.retry_after), (false, Reason::MinGap, Some(60.0)));
    assert!(!soon.after[0].1, "a denial writes nothing");
    assert!(plan(std::slice::from_ref(&state), &c, NOW + 100.0, 1.0, false).ok, "exactly min_gap later");
    // The limit's own wait wins when it is later.
    let owing = State { value: -1.0, ..state.clone() };
    assert_eq!(plan(std::slice::from_ref(&owing), &c, NOW + 40.0, 1.0, false).retry_after, Some(160.0));
    // Count 0 answers without moving the gap.
    assert_eq!(plan(&[at(10.0, NOW)], &c, NOW, 0.0, false).after[0].0.granted_at, None);
    assert_eq!(expires(&state, &c), NOW + 100.0, "refilled at once, but the gap lasts");
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
    assert_eq!(plan(std::slice::from_ref(&state), &sliding, NOW, 9.0, false).granted, 4.0);
}

#[test]
fn penalize_mode_counts_denied_calls_down_to_minus_capacity() {
    let c = Config { mode: Mode::Penalize, ..config(Kind::TokenBucket, 10.0, 10.0 * SECOND) };
    let denied = plan(&[at(0.0, NOW)], &c, NOW, 4.0, false);
    let owed = State { counts: State::capacity_mark(10.0), ..at(-4.0, NOW) };
    assert_eq!((denied.ok, denied.granted, denied.after[0].clone()), (false, 0.0, (owed, true)), "with the capacity it is left of");
    assert_eq!(denied.retry_after, Some(8.0 * SECOND), "the 4 owed, then 4 more");
    assert_eq!(denied.available[0], -4.0);
    let capped = plan(&[at(-8.0, NOW)], &c, NOW, 4.0, false);
    assert_eq!(capped.after[0].0.value, -10.0, "never below -capacity");
    assert_eq!(capped.retry_after, Some(14.0 * SECOND));
    let fixed = Config { mode: Mode::Penalize, ..config(Kind::FixedWindow, 10.0, MINUTE) };
    assert_eq!(plan(&[at(1.0, NOW)], &fixed, NOW, 30.0 - 19.0, false).after[0].0.value, -10.0);
    let sliding = Config { mode: Mode::Penalize, ..config(Kind::SlidingWindow, 10.0, MINUTE) };
    let full = State { value: 0.0, ts: NOW, counts: Counts::new(&[0.0]).unwrap(), granted_at: None };
    let over = plan(std::slice::from_ref(&full), &sliding, NOW, 25.0 - 15.0, false);
    assert_eq!(over.after[0].0.value, -10.0, "at most 2 x rate taken in a window");
    assert_eq!(over.retry_after, Some(2.0 * MINUTE), "10 more need the 20 taken to weigh nothing");
}

/// The vector: rate 3 per 1000 ms in 10 cells from T0.
#[test]
fn rolling_window_vector() {
    let c = Config { start: Some(NOW), ..config(Kind::RollingWindow, 3.0, SECOND) };
    let mut state = fresh_state(&c, NOW, 0.0);
    let mut call = |at: f64| {
        let outcome = plan(std::slice::from_ref(&state), &c, NOW + at, 1.0, false);
        if outcome.ok {
            state = outcome.after[0].0.clone();
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
    assert_eq!(reset_after(&state, &c, NOW + 1150.0), 1050.0, "the token of 1100 counts until 2200");
    assert_eq!(expires(&state, &c), NOW + 2200.0);
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
            let outcome = plan(std::slice::from_ref(&state), &c, now, count, false);
            if outcome.ok {
                state = outcome.after[0].0.clone();
                grants.push((now, count));
                let recent: f64 = grants.iter().filter(|(t, _)| now - t < period).map(|(_, n)| n).sum();
                assert!(recent <= rate, "round {round}: {recent} in one period");
                continue;
            }
            let retry = outcome.retry_after.expect("a denial says when");
            assert!(plan(std::slice::from_ref(&state), &c, now + retry, count, false).ok, "round {round}: passes at retry_after");
            if retry > 1.0 {
                assert!(!plan(std::slice::from_ref(&state), &c, now + retry - 1.0, count, false).ok, "round {round}: not 1 ms earlier");
            }
        }
    }
}

/// The sliding window's counts mean the same under any rate: a lower rate neither forgets
/// nor invents a taken token, and a credit under a higher one gives back only what was taken.
/// A row written before 0.5.0 (no current count) is read as `rate - value`, never below 0.
#[test]
fn sliding_window_counts_hold_under_another_rate() {
    let high = config(Kind::SlidingWindow, 100.0, MINUTE);
    let low = config(Kind::SlidingWindow, 10.0, MINUTE);
    let one = check(&fresh_state(&high, NOW, 0.0), &high, NOW, 1.0, false).state();
    assert_eq!(check(&one, &low, NOW, 0.0, false).available, 9.0);
    assert!(check(&one, &low, NOW, 9.0, false).ok);
    assert!(!check(&one, &low, NOW, 10.0, false).ok);
    let (back, given) = super::credit::credit(&one, &config(Kind::SlidingWindow, 1e6, MINUTE), NOW, 1e6);
    assert_eq!(given, 1.0);
    assert_eq!(check(&back, &low, NOW, 0.0, false).available, 10.0);
    // The modes read the same counts: 6 of 10 taken leaves 4 to a partial call, and a
    // penalized one takes up to twice the rate in the window.
    let partial = Config { mode: Mode::Partial, ..low };
    let six = State { value: 4.0, ts: NOW, counts: Counts::new(&[0.0, 6.0]).unwrap(), granted_at: None };
    assert_eq!(plan(std::slice::from_ref(&six), &partial, NOW, 9.0, false).granted, 4.0);
    let penalize = Config { mode: Mode::Penalize, ..low };
    let ten = State { value: 0.0, ts: NOW, counts: Counts::new(&[0.0, 10.0]).unwrap(), granted_at: None };
    assert_eq!(plan(std::slice::from_ref(&ten), &penalize, NOW, 10.0, false).after[0].0.value, -10.0);
    let legacy = State { value: 99.0, ts: NOW, counts: Counts::new(&[0.0]).unwrap(), granted_at: None };
    assert_eq!(check(&legacy, &low, NOW, 0.0, false).available, 10.0, "clamped, as a token bucket's level is");
    assert!(!check(&legacy, &low, NOW, 11.0, false).ok);
}

/// Issue 64: numbers changed under a key (an override, a tier, a redefinition) keep what it
/// used. A token bucket keeps its deficit below capacity and a fixed window the tokens taken
/// in its window: raised, the difference at once; lowered below what was used, none until
/// the bucket refills or the window ends. Under the same numbers, the arithmetic is the
/// Convex component's, bit for bit.
#[test]
fn numbers_changed_under_a_key_keep_what_it_used() {
    for kind in [Kind::TokenBucket, Kind::FixedWindow] {
        let three = config(kind, 3.0, HOUR);
        let ten = config(kind, 10.0, HOUR);
        let mut state = fresh_state(&three, NOW, 0.0);
        for _ in 0..3 {
            state = check(&state, &three, NOW, 1.0, false).state();
        }
        assert!(!check(&state, &three, NOW, 1.0, false).ok, "{kind:?}: 3 taken");
        assert_eq!(state.written_under(), Some(3.0));
        // A sliding window row of 0.4.0 keeps one count too, never negative: not a capacity.
        assert_eq!(State { counts: Counts::new(&[3.0]).unwrap(), ..state }.written_under(), None);
        let raised = check(&state, &ten, NOW, 7.0, false);
        assert!(raised.ok && !check(&raised.state(), &ten, NOW, 1.0, false).ok, "{kind:?}: 7 more, not 0 or 10");
        // An override of 6 ends after 4 taken, under 2: the key used 4 of the 2 it now has.
        let (six, two) = (config(kind, 6.0, HOUR), config(kind, 2.0, HOUR));
        let mut state = fresh_state(&six, NOW, 0.0);
        for _ in 0..4 {
            state = check(&state, &six, NOW, 1.0, false).state();
        }
        assert!(!check(&state, &two, NOW + SECOND, 1.0, false).ok, "{kind:?}: none under 2 after 4 taken");
        let window_later = check(&state, &two, NOW + HOUR, 0.0, false).value;
        match kind {
            // The deficit of 2 is paid back by an hour's refill of 2: empty, not full.
            Kind::TokenBucket => assert!(window_later.abs() < 1e-9, "{window_later}"),
            // A new window: what was used in the last one is forgotten.
            _ => assert_eq!(window_later, 2.0),
        }
        // A debt of reservations is kept, never made deeper by a lowering.
        let owing = State { value: -1.0, ts: NOW, counts: State::capacity_mark(3.0), granted_at: None };
        let lowered = check(&owing, &config(kind, 1.0, HOUR), NOW, 0.0, false).value;
        assert_eq!(lowered, if kind == Kind::TokenBucket { -3.0 } else { -1.0 }, "{kind:?}");
        // A state written before 0.8.0 (no count) is read as it stands, as before.
        assert_eq!(check(&at(0.0, NOW), &ten, NOW, 0.0, false).value, 0.0);
        // Same numbers: the arithmetic is unchanged.
        assert_eq!(check(&state, &six, NOW, 1.0, false).value, check(&at(state.value, NOW), &six, NOW, 1.0, false).value);
    }
    // A share of several shards keeps no mark, and reads a marked state at its level: a limit
    // of 40 in 4 shards, drained, made one shard, gives none more in the window (its shard 0
    // saw 10 of the 40 taken); one shard made 4 reads shard 0 at its level, as before 0.8.0.
    for kind in [Kind::TokenBucket, Kind::FixedWindow] {
        let four = Config { shards: 4, ..config(kind, 40.0, HOUR) };
        let share = check(&fresh_state(&four.per_shard(), NOW, 0.0), &four.per_shard(), NOW, 10.0, false).state();
        assert_eq!((share.value, share.written_under()), (0.0, None), "{kind:?}");
        assert!(!check(&share, &config(kind, 40.0, HOUR), NOW, 1.0, false).ok, "{kind:?}: none more as one shard");
        let whole = check(&fresh_state(&config(kind, 40.0, HOUR), NOW, 0.0), &config(kind, 40.0, HOUR), NOW, 40.0, false).state();
        assert_eq!(check(&whole, &four.per_shard(), NOW, 0.0, false).value, 0.0, "{kind:?}: the level, no carry");
    }
    // Read twice, a carried state changes no more (its mark is the new capacity).
    let tb3 = config(Kind::TokenBucket, 3.0, HOUR);
    let three_used = check(&fresh_state(&tb3, NOW, 0.0), &tb3, NOW, 3.0, false).state();
    let tb10 = config(Kind::TokenBucket, 10.0, HOUR);
    assert_eq!(carried(&carried(&three_used, &tb10), &tb10), carried(&three_used, &tb10));
    assert_eq!(reset_after(&three_used, &tb10, NOW), 3.0 / 10.0 * HOUR, "3 used, refilled at 10 an hour");
    // A window kind reads such a state as a row of another kind: the tokens used count.
    let tb = config(Kind::TokenBucket, 10.0, HOUR);
    let used = check(&fresh_state(&tb, NOW, 0.0), &tb, NOW, 4.0, false).state();
    let sliding = config(Kind::SlidingWindow, 5.0, HOUR);
    assert_eq!(check(&used, &sliding, NOW, 1.0, false).available, 0.0, "4 used of 5");
    // And a row full again expires as a fresh one would.
    let full_at = expires(&used, &tb);
    assert!((NOW + 0.4 * HOUR..NOW + 0.4 * HOUR + 2.0).contains(&full_at), "{full_at}");
}
