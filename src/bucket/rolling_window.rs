//! The rolling window (RisingStack's sampled log), conservative: at most `rate` tokens in
//! any interval of length `period`.
//!
//! Time is cut into `buckets` cells of `g`, aligned as windows are. Tokens taken in the cell
//! `[b g, (b + 1) g)` count at every instant before `(b + 1) g + buckets g`, and `buckets g`
//! is at least `period`: never less than a full period after they were taken, so no interval
//! of `period` holds more than `rate`. (RisingStack drops them up to one cell early.) From
//! the current cell `k`, the cells `k - buckets ..= k` count: `buckets + 1` of them.
//!
//! Cells are whole microseconds (`g` is `period / buckets` rounded up), and their bounds are
//! computed in integers, so that a stored cell start and a fresh one agree exactly.
//!
//! Stored: `ts` is the start of the current cell, `counts` the tokens of the counting
//! cells, oldest first, and `value` what is left, `rate - sum(counts)`, for a reader.

use super::types::{Check, Config, Counts, State};
use crate::call::Reason;

fn us(ms: f64) -> i64 {
    (ms * 1000.0).round() as i64
}

fn ms(us: i64) -> f64 {
    us as f64 / 1000.0
}

/// The cell width in microseconds.
fn width(config: &Config) -> i64 {
    (us(config.period) + i64::from(config.buckets) - 1) / i64::from(config.buckets)
}

/// The start of the cell that `now` falls in, cells being aligned to `anchor`.
pub(super) fn cell_start(config: &Config, anchor: f64, now: f64) -> f64 {
    let (anchor, g) = (us(anchor), width(config));
    ms(anchor + (us(now) - anchor).div_euclid(g) * g)
}

/// The counting cells as of `at`: the start of the cell `at` falls in, and their counts.
fn cells(state: &State, config: &Config, at: f64) -> (f64, Vec<f64>) {
    let (ts, g) = (us(state.ts), width(config));
    let n = config.buckets as usize + 1;
    // A clock that steps back stays in the stored cell.
    let shift = (us(at) - ts).max(0) / g;
    let stored = state.counts.as_slice();
    let mut counts = vec![0.0; n];
    if shift < n as i64 {
        let shift = shift as usize;
        // The newest stored cell lands `shift` cells back (also when a config with other
        // buckets stored the row).
        let skip = (stored.len() + shift).saturating_sub(n);
        for (i, c) in stored.iter().enumerate().skip(skip) {
            counts[i + n - stored.len() - shift] = *c;
        }
    }
    (ms(ts + shift * g), counts)
}

pub(super) fn check(state: &State, config: &Config, now: f64, count: f64) -> Check {
    let (start, mut counts) = cells(state, config, now);
    let taken: f64 = counts.iter().sum();
    let ok = taken + count <= config.rate;
    *counts.last_mut().expect("buckets >= 1") += count;
    Check {
        ok,
        value: config.rate - taken - count,
        ts: start,
        counts: Counts::new(&counts).expect("at most MAX_COUNTS cells"),
        available: config.rate - taken - count,
        retry_after: (!ok).then(|| retry_at(state, config, now, count) - now),
        granted_at: None,
        reason: Reason::Exhausted,
    }
}

/// What is left of the rate when the counting cells hold `cells`.
pub(super) fn left(cells: &[f64], config: &Config) -> f64 {
    config.rate - cells.iter().sum::<f64>()
}

/// The earliest instant from `now` on at which taking `count` is allowed: the start of the
/// first later cell from which enough of the oldest cells no longer count.
fn retry_at(state: &State, config: &Config, now: f64, count: f64) -> f64 {
    let (start, counts) = cells(state, config, now);
    let mut left: f64 = counts.iter().sum();
    let mut shift = counts.len();
    for (i, c) in counts.iter().enumerate() {
        left -= c;
        if left + count <= config.rate {
            shift = i + 1;
            break;
        }
    }
    ms(us(start) + shift as i64 * width(config))
}

/// Milliseconds from `now` until no taken token counts any more.
pub(super) fn reset_after(state: &State, config: &Config, now: f64) -> f64 {
    let (start, counts) = cells(state, config, now);
    match counts.iter().rposition(|c| *c != 0.0) {
        Some(last) => (ms(us(start) + (last as i64 + 1) * width(config)) - now).max(0.0),
        None => 0.0,
    }
}

/// When no taken token counts any more (see `super::expires`).
pub(super) fn expires(state: &State, config: &Config) -> f64 {
    match state.counts.as_slice().iter().rposition(|c| *c != 0.0) {
        Some(last) => ms(us(state.ts) + (last as i64 + 1) * width(config)),
        None => state.ts,
    }
}
