//! Giving tokens back (the Convex component's `credit`): what a shard holds after `count`
//! tokens are returned at `now`, and how many it took back.
//!
//! Each kind takes back only what it still counts, so a credit leaves a state that the same
//! calls with smaller takes could have left, and no more than the limit admits can ever be
//! consumed net (tokens taken minus tokens credited; docs/semantics.md#credits):
//! - token bucket and fixed window: the value, refilled to `now`, rises by `count`, capped at
//!   `capacity` (the excess is discarded, as Convex does); a debt of reservations is paid first.
//! - sliding window: from the tokens of the current window, then of the previous one while it
//!   still weighs; tokens of older windows no longer count and do not come back.
//! - rolling window: from the newest cells that hold tokens, back to the oldest cell that
//!   still counts.

use super::shard::check;
use super::types::{Config, Counts, Kind, State};
use super::{rolling_window, sliding_window};

/// The shard's state after a credit of `count` at `now`, and how much it took back
/// (`0 <= given <= count`).
pub fn credit(state: &State, config: &Config, now: f64, count: f64) -> (State, f64) {
    // Refilled, windows moved on and an ended gap forgotten, as a call at `now` would.
    let now_state = check(state, config, now, 0.0, false).state();
    match config.kind {
        Kind::Concurrency => unreachable!("a concurrency limit has no state row"),
        Kind::TokenBucket | Kind::FixedWindow => {
            let given = count.min(config.capacity - now_state.value).max(0.0);
            (State { value: now_state.value + given, ..now_state }, given)
        }
        Kind::SlidingWindow => {
            let (current, previous) = sliding_window::taken(&now_state, config);
            let from_current = count.min(current);
            let from_previous = (count - from_current).min(previous);
            let state = sliding_window::state(config, now_state.ts, previous - from_previous, current - from_current, now_state.granted_at);
            (state, from_current + from_previous)
        }
        Kind::RollingWindow => {
            let mut cells = now_state.counts.as_slice().to_vec();
            let mut left = count;
            for cell in cells.iter_mut().rev() {
                let back = left.min(*cell);
                *cell -= back;
                left -= back;
            }
            let given = count - left;
            let counts = Counts::new(&cells).expect("as many cells as before");
            (State { value: rolling_window::left(&cells, config), counts, ..now_state }, given)
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use super::super::tests::{config, ALL_KINDS, NOW};
    use super::super::{check, fresh_state, plan_credit, Config, Kind, State};
    use super::credit;

    fn take(state: &State, c: &Config, now: f64, count: f64) -> State {
        let taken = check(state, c, now, count, false);
        assert!(taken.ok);
        taken.state()
    }

    #[test]
    fn each_kind_gives_back_only_what_it_still_counts() {
        for kind in ALL_KINDS {
            let c = config(kind, 10.0, 60_000.0);
            let full = fresh_state(&c, NOW, 0.0);
            let used = take(&full, &c, NOW, 7.0);
            // Part of what was taken, then more than is left to give: clamped, not an error.
            let (back, given) = credit(&used, &c, NOW, 4.0);
            assert_eq!(given, 4.0, "{kind:?}");
            assert_eq!(check(&back, &c, NOW, 0.0, false).available, 7.0, "{kind:?}");
            let (back, given) = credit(&back, &c, NOW, 100.0);
            assert_eq!(given, 3.0, "{kind:?}: only what was still taken comes back");
            assert_eq!(check(&back, &c, NOW, 0.0, false).available, 10.0, "{kind:?}");
            assert_eq!(credit(&full, &c, NOW, 5.0).1, 0.0, "{kind:?}: a full limit takes nothing back");
        }
    }

    #[test]
    fn a_window_that_no_longer_counts_takes_nothing_back() {
        for kind in [Kind::FixedWindow, Kind::SlidingWindow, Kind::RollingWindow] {
            let c = config(kind, 10.0, 60_000.0);
            let used = take(&fresh_state(&c, NOW, 0.0), &c, NOW, 10.0);
            // Two periods on, nothing taken then still counts.
            assert_eq!(credit(&used, &c, NOW + 120_000.0, 5.0).1, 0.0, "{kind:?}");
        }
        // The sliding window's previous window still weighs: its tokens come back, after the
        // current window's.
        let c = config(Kind::SlidingWindow, 10.0, 60_000.0);
        let before = take(&fresh_state(&c, NOW, 0.0), &c, NOW, 6.0);
        let now = take(&before, &c, NOW + 60_000.0, 3.0);
        let (back, given) = credit(&now, &c, NOW + 60_000.0, 5.0);
        assert_eq!((given, back.value, back.counts.get(0)), (5.0, 10.0, 4.0), "3 from this window, 2 from the last");
        // The rolling window's newest cells first.
        let c = config(Kind::RollingWindow, 10.0, 10_000.0);
        let first = take(&fresh_state(&c, NOW, 0.0), &c, NOW, 4.0);
        let second = take(&first, &c, NOW + 5_000.0, 4.0);
        let (back, _) = credit(&second, &c, NOW + 5_000.0, 5.0);
        let cells = back.counts.as_slice();
        assert_eq!((cells[cells.len() - 1], cells.iter().sum::<f64>()), (0.0, 3.0), "the newest cell first, then older");
    }

    #[test]
    fn a_token_bucket_pays_a_debt_first_and_never_goes_above_capacity() {
        let c = Config { capacity: 20.0, ..config(Kind::TokenBucket, 10.0, 60_000.0) };
        let owed = check(&fresh_state(&c, NOW, 0.0), &c, NOW, 30.0, true).state();
        assert_eq!(owed.value, -10.0);
        let (back, given) = credit(&owed, &c, NOW, 25.0);
        assert_eq!((back.value, given), (15.0, 25.0));
        // Refilled first: 30 s later 5 more are there, so only 0 of 10 fit... up to capacity.
        let (back, given) = credit(&back, &c, NOW + 30_000.0, 10.0);
        assert_eq!((back.value, given), (20.0, 0.0));
    }

    #[test]
    fn a_sharded_credit_fills_the_emptiest_shard_looked_at() {
        let c = Config { shards: 4, ..config(Kind::TokenBucket, 40.0, 60_000.0) }.per_shard();
        let full = fresh_state(&c, NOW, 0.0);
        let emptier = take(&full, &c, NOW, 8.0);
        let fuller = take(&full, &c, NOW, 3.0);
        let outcome = plan_credit(&[fuller, emptier], &c, NOW, 20.0);
        assert!(outcome.ok);
        assert_eq!(outcome.granted, -8.0, "capped at the shard's capacity, the rest discarded");
        assert_eq!((outcome.after[0].1, outcome.after[1].1), (false, true));
        assert_eq!(outcome.available[..], [7.0, 10.0]);
    }

    /// Over random sequences of takes and credits on a fake clock, no kind lets more through,
    /// net of what was given back, than its stated bound:
    /// - token bucket: at most `capacity + rate x elapsed` over any interval;
    /// - fixed window: at most `capacity + rate x windows begun` over any interval;
    /// - sliding window: at most `rate` within one window;
    /// - rolling window: at most `rate` within any interval shorter than `period`.
    #[test]
    fn credits_never_let_net_consumption_past_the_bound() {
        let mut rng = StdRng::seed_from_u64(67);
        let mut given_back = 0.0;
        for round in 0..2_000 {
            let kind = ALL_KINDS[round % 4];
            let rate = f64::from(rng.gen_range(1..20));
            let period = f64::from(rng.gen_range(100..5_000));
            let c = Config {
                capacity: if kind.can_reserve() { rate * f64::from(rng.gen_range(1..4)) } else { rate },
                buckets: if kind == Kind::RollingWindow { rng.gen_range(1..=20) } else { 0 },
                ..config(kind, rate, period)
            };
            let mut state = fresh_state(&c, NOW, 0.0);
            let anchor = state.ts;
            let mut now = NOW;
            // (instant, tokens: + taken, - given back)
            let mut events: Vec<(f64, f64)> = Vec::new();
            for _ in 0..60 {
                now += f64::from(rng.gen_range(0..(period as u32 / 3).max(1)));
                if rng.gen_bool(0.6) {
                    let count = f64::from(rng.gen_range(1..=c.capacity as u32));
                    let taken = check(&state, &c, now, count, false);
                    if taken.ok {
                        state = taken.state();
                        events.push((now, count));
                    }
                } else {
                    let count = f64::from(rng.gen_range(0..=(2.0 * c.capacity) as u32));
                    let (after, given) = credit(&state, &c, now, count);
                    assert!((0.0..=count).contains(&given));
                    state = after;
                    given_back += given;
                    events.push((now, -given));
                }
            }
            let window = |t: f64| ((t - anchor) / period).floor();
            for i in 0..events.len() {
                let mut net = 0.0;
                for j in i..events.len() {
                    net += events[j].1;
                    let (t0, t1) = (events[i].0, events[j].0);
                    let bound = match kind {
                        Kind::TokenBucket => c.capacity + rate / period * (t1 - t0),
                        Kind::FixedWindow => c.capacity + rate * (window(t1) - window(t0)),
                        Kind::SlidingWindow if window(t1) == window(t0) => rate,
                        Kind::RollingWindow if t1 - t0 < period => rate,
                        _ => f64::INFINITY,
                    };
                    assert!(net <= bound + 1e-9, "{kind:?} round {round}: {net} net over [{t0}, {t1}], bound {bound}");
                }
            }
        }
        assert!(given_back > 1_000.0, "the sequences gave tokens back");
    }
}
