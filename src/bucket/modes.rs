//! What a call the limit denies does instead, by mode: RisingStack's n-ary mode takes what
//! there is (`partial`), its uniform mode counts denied calls too (`penalize`).

use super::{check, Check, Config, Reason, State};

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

pub(super) enum Instead {
    /// Take this (ok), which grants the amount given.
    Partial(Check, f64),
    /// Store this although the call is denied.
    Penalty(Check),
}

/// What to do instead of the plain denial `denied` of `count` from `state` at `now`.
pub(super) fn instead_of_denial(state: State, denied: Check, config: &Config, now: f64, count: f64) -> Option<Instead> {
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
            let penalized = State { value: denied.value.max(-config.capacity), ..denied.state() };
            // When the same call would pass, now that this one has been counted.
            let again = check(penalized, config, now, count, false);
            Some(Instead::Penalty(Check {
                value: penalized.value,
                available: check(penalized, config, now, 0.0, false).available,
                retry_after: again.retry_after,
                ..denied
            }))
        }
    }
}
