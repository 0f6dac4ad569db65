//! A concurrency limit: at most `capacity` slots held at once per (name, key). What is held
//! is found outside (transactions' slots and leases, `storage`); this is the arithmetic of
//! one answer.

/// The longest lease, as the longest period: 100 years.
pub const MAX_LEASE_MS: f64 = 100.0 * 365.25 * 86_400_000.0;

/// What a (name, key) holds, as one call found it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Held {
    /// Slots held by transactions (this call's own among them) or by unexpired leases.
    pub slots: u32,
    /// Of those, held by a transaction and no lease: they end when it does, at no known time.
    pub by_transactions: u32,
    /// When the soonest and the latest unexpired lease end (ms since the epoch).
    pub soonest_lease_end: Option<f64>,
    pub latest_lease_end: Option<f64>,
}

/// The answer to a call for `count` slots of a limit of `capacity`, given what was held
/// besides what the call took (`took`: whether it took its `count`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Answer {
    pub ok: bool,
    /// Denied: when to try again, the soonest lease's end or else `period` (a transaction's
    /// slot ends at no time anyone knows).
    pub retry_after: Option<f64>,
    pub remaining: f64,
    /// Until nothing is held: the latest lease's end, or `period` while a transaction holds
    /// a slot and no lease ends later.
    pub reset_after: f64,
}

pub fn answer(capacity: f64, period: f64, held: &Held, count: f64, took: bool, now: f64) -> Answer {
    let free = capacity - f64::from(held.slots);
    let ok = took || count <= free;
    let until = |end: Option<f64>| end.map_or(0.0, |e| (e - now).max(0.0));
    let after_transactions = if held.by_transactions > 0 { period } else { 0.0 };
    let reset_after = until(held.latest_lease_end).max(after_transactions);
    Answer {
        ok,
        retry_after: (!ok).then(|| held.soonest_lease_end.map_or(period, |e| (e - now).clamp(0.0, period))),
        remaining: if took { free - count } else { free },
        reset_after: if took && count > 0.0 { reset_after.max(period) } else { reset_after },
    }
}

#[cfg(test)]
mod tests {
    use super::{answer, Held};

    #[test]
    fn a_call_is_ok_while_its_count_fits_in_what_is_free() {
        let held = Held { slots: 3, by_transactions: 3, ..Held::default() };
        assert!(answer(5.0, 1000.0, &held, 2.0, false, 0.0).ok);
        let denied = answer(5.0, 1000.0, &held, 3.0, false, 0.0);
        assert!(!denied.ok);
        assert_eq!(denied.remaining, 2.0);
        assert_eq!(denied.retry_after, Some(1000.0), "no lease ends: try again after a period");
    }

    #[test]
    fn a_denial_waits_for_the_soonest_lease_but_never_more_than_a_period() {
        let held = Held { slots: 2, by_transactions: 0, soonest_lease_end: Some(250.0), latest_lease_end: Some(9000.0) };
        let denied = answer(2.0, 1000.0, &held, 1.0, false, 100.0);
        assert_eq!(denied.retry_after, Some(150.0));
        assert_eq!(denied.reset_after, 8900.0);
        let far = Held { soonest_lease_end: Some(50_000.0), ..held };
        assert_eq!(answer(2.0, 1000.0, &far, 1.0, false, 0.0).retry_after, Some(1000.0));
    }

    #[test]
    fn what_a_call_took_is_no_longer_remaining() {
        let taken = answer(5.0, 1000.0, &Held { slots: 1, by_transactions: 1, ..Held::default() }, 2.0, true, 0.0);
        assert_eq!((taken.ok, taken.remaining, taken.retry_after), (true, 2.0, None));
        assert_eq!(taken.reset_after, 1000.0);
        let nothing = answer(5.0, 1000.0, &Held::default(), 0.0, true, 0.0);
        assert_eq!((nothing.remaining, nothing.reset_after), (5.0, 0.0));
    }
}
