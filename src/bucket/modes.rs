//! What a call the limit denies does instead, by mode: RisingStack's n-ary mode takes what
//! there is (`partial`), its uniform mode counts denied calls too (`penalize`).

use super::shard::check;
use super::types::{Check, Config, Mode, State};
use crate::call::Reason;

pub(super) enum Instead {
    /// Take this (ok), which grants the amount given.
    Partial(Check, f64),
    /// Store this although the call is denied.
    Penalty(Check),
}

/// What to do instead of the plain denial `denied` of `count` from `state` at `now`.
pub(super) fn instead_of_denial(state: &State, denied: &Check, config: &Config, now: f64, count: f64) -> Option<Instead> {
    match config.mode {
        Mode::All => None,
        Mode::Partial => {
            if denied.reason != Reason::Exhausted {
                return None;
            }
            let free = check(state, config, now, 0.0, false).available;
            let amount = if count.fract() == 0.0 { free.floor() } else { free }.min(count);
            if amount <= 0.0 {
                return None;
            }
            let part = check(state, config, now, amount, false);
            part.ok.then_some(Instead::Partial(part, amount))
        }
        Mode::Penalize => {
            // Take as much of count as keeps the value at -capacity or above; the call stays
            // denied, and the gap keeps counting from the last granted call.
            let before = check(state, config, now, 0.0, false);
            let penalty = count.min(before.value + config.capacity).max(0.0);
            let penalized = Check { granted_at: denied.granted_at, ..check(state, config, now, penalty, false) };
            // When the same call would pass, now that this one has been counted.
            let again = check(&penalized.state(), config, now, count, false);
            Some(Instead::Penalty(Check {
                ok: false,
                retry_after: again.retry_after,
                reason: denied.reason,
                available: check(&penalized.state(), config, now, 0.0, false).available,
                ..penalized
            }))
        }
    }
}
