//! Calendar windows: a fixed window whose period is whole months, one day or one week starts
//! its windows on the calendar's boundaries in a time zone (the 1st of the month, midnight,
//! Monday; or `start`'s day, time and weekday), not every so many milliseconds. A month is 28
//! to 31 days long and a Berlin day 23 to 25 hours; each window ends where the next begins.
//!
//! Boundaries are computed on the local wall clock (as if it were UTC, in ms since
//! 1970-01-01) and turned into instants by the zone: the k-th boundary is the anchor plus k
//! units of local time, the day of the month cut to the month's last (an anchor on the 31st
//! gives the 30th of April and the 28th or 29th of February, and the 31st again in May).

use std::fmt;

/// The instant PostgreSQL can no longer store (294277-01-01, its END_TIMESTAMP), in ms since
/// the Unix epoch.
pub const END_OF_TIME_MS: f64 = 9_224_318_016_000_000.0;

const DAY_MS: f64 = 86_400_000.0;
/// 1970-01-05, a Monday: ISO 8601 weeks start there.
const FIRST_MONDAY_MS: f64 = 4.0 * DAY_MS;

/// A time zone: its offset from UTC at each instant, and from it the wall clock, in ms since
/// 1970-01-01 (the wall clock read as if it were UTC).
pub trait Zone {
    fn name(&self) -> &str;
    /// Milliseconds the wall clock is ahead of UTC at `utc_ms`.
    fn offset(&self, utc_ms: f64) -> f64;

    fn local(&self, utc_ms: f64) -> f64 {
        utc_ms + self.offset(utc_ms)
    }

    /// The instant the wall clock shows `local_ms`. Where a change of offset skips that time
    /// or shows it twice, the offset in force before the change decides, as PostgreSQL's own
    /// `AT TIME ZONE` does: a skipped time lands after the gap, a repeated one is the earlier.
    fn utc(&self, local_ms: f64) -> f64 {
        const HALF_DAY: f64 = 43_200_000.0;
        let before = self.offset(local_ms - HALF_DAY);
        let after = self.offset(local_ms + HALF_DAY);
        if self.offset(local_ms - before) == before {
            local_ms - before
        } else if self.offset(local_ms - after) == after {
            local_ms - after
        } else {
            local_ms - before
        }
    }
}

/// UTC, where the wall clock is the instant.
pub struct Utc;

impl Zone for Utc {
    fn name(&self) -> &str {
        "UTC"
    }
    fn offset(&self, _utc_ms: f64) -> f64 {
        0.0
    }
}

/// The length of a calendar window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Whole months (12 for a year).
    Months(u32),
    /// One day or one week (7).
    Days(u32),
}

impl Unit {
    /// The calendar unit of a period of `months`, `days` and `micros` (an interval's
    /// fields), if it is one: whole months and nothing else, exactly one day, or exactly one
    /// week. Other periods (`'30 days'`, `'24 hours'`, `'2 days'`) have a fixed length.
    pub fn of(months: i32, days: i32, micros: i64) -> Option<Unit> {
        match (months, days, micros) {
            (m, 0, 0) if m > 0 => Some(Unit::Months(m as u32)),
            (0, d @ (1 | 7), 0) => Some(Unit::Days(d as u32)),
            _ => None,
        }
    }
}

/// Where a limit's calendar windows begin: its unit, its zone and the local time of one
/// boundary.
#[derive(Clone, Copy)]
pub struct Calendar {
    pub unit: Unit,
    pub zone: &'static dyn Zone,
    /// A boundary on the local wall clock: `start`'s, else the epoch's midnight on the 1st
    /// (months, days) or the first Monday (weeks).
    anchor: f64,
    /// The window of PostgreSQL's last storable instant: none begins after it.
    last: i64,
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Calendar({:?} in {}, anchor {})", self.unit, self.zone.name(), self.anchor)
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.unit == other.unit && self.zone.name() == other.zone.name() && self.anchor == other.anchor
    }
}

impl Calendar {
    /// Windows of `unit` in `zone`, one of them starting at `start` (ms since the epoch)
    /// when given.
    pub fn new(unit: Unit, zone: &'static dyn Zone, start: Option<f64>) -> Calendar {
        let anchor = match (start, unit) {
            (Some(start), _) => zone.local(start),
            (None, Unit::Days(7)) => FIRST_MONDAY_MS,
            (None, _) => 0.0,
        };
        let mut c = Calendar { unit, zone, anchor, last: 0 };
        c.last = c.index(END_OF_TIME_MS);
        c
    }

    /// The instant the `k`-th window after the anchor's begins (`k` may be negative).
    pub fn boundary(&self, k: i64) -> f64 {
        let local = match self.unit {
            Unit::Days(n) => self.anchor + k as f64 * f64::from(n) * DAY_MS,
            Unit::Months(n) => add_months(self.anchor, k * i64::from(n)),
        };
        self.zone.utc(local)
    }

    /// Which window `at` falls in: the `k` with `boundary(k) <= at < boundary(k + 1)`, for
    /// `at` within the instants PostgreSQL can store (beyond them, as at their ends).
    pub fn index(&self, at: f64) -> i64 {
        let at = at.clamp(-END_OF_TIME_MS, END_OF_TIME_MS);
        let local = self.zone.local(at);
        let mut k = match self.unit {
            Unit::Days(n) => ((local - self.anchor) / (f64::from(n) * DAY_MS)).floor() as i64,
            Unit::Months(n) => (month_number(local) - month_number(self.anchor)).div_euclid(i64::from(n)),
        };
        // The estimate is off by one at most, near a boundary or a change of offset: a few
        // steps, never a loop a strange zone could keep going.
        for _ in 0..4 {
            if self.boundary(k) > at {
                k -= 1;
            } else if self.boundary(k + 1) <= at {
                k += 1;
            } else {
                break;
            }
        }
        k
    }

    /// The start of the window `at` falls in.
    pub fn window_start(&self, at: f64) -> f64 {
        self.boundary(self.index(at))
    }

    /// The start of the window `windows` after the one starting at `start`; infinity past
    /// the last instant PostgreSQL can store (a reservation's debt can reach that far).
    pub fn after(&self, start: f64, windows: f64) -> f64 {
        let k = self.index(start) as f64 + windows;
        if k.is_nan() || k > self.last as f64 {
            return f64::INFINITY;
        }
        self.boundary(k as i64)
    }

    /// The longest a window can be: a month of 31 days, a day of 25 hours.
    pub fn longest_ms(&self) -> f64 {
        match self.unit {
            Unit::Months(n) => f64::from(n) * 31.0 * DAY_MS,
            Unit::Days(n) => f64::from(n) * DAY_MS + 3_600_000.0,
        }
    }

    /// Whole windows from the one starting at `start` to the one `at` falls in.
    pub fn windows_between(&self, start: f64, at: f64) -> f64 {
        (self.index(at) - self.index(start)).max(0) as f64
    }
}

/// Days from 1970-01-01 to the civil date (y, m, d) (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date (y, m, d) of day `z` since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Months since January 1970 of a local time.
fn month_number(local: f64) -> i64 {
    let (y, m, _) = civil_from_days((local / DAY_MS).floor() as i64);
    y * 12 + m - 1 - 1970 * 12
}

/// `local` plus `months` on the calendar, the day cut to the month's last, the time of day
/// kept.
fn add_months(local: f64, months: i64) -> f64 {
    let day = (local / DAY_MS).floor();
    let time_of_day = local - day * DAY_MS;
    let (y, m, d) = civil_from_days(day as i64);
    let total = y * 12 + (m - 1) + months;
    let (y, m) = (total.div_euclid(12), total.rem_euclid(12) + 1);
    let d = d.min(days_in_month(y, m));
    days_from_civil(y, m, d) as f64 * DAY_MS + time_of_day
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zone one hour ahead of UTC in winter and two in summer, switching at 01:00 UTC on
    /// the last Sundays of March and October, as the European Union's zones do.
    struct Berlin;

    fn last_sunday(y: i64, m: i64) -> f64 {
        let last = days_from_civil(y, m, days_in_month(y, m));
        // 1970-01-01 was a Thursday: day 3 is the first Sunday.
        (last - (last - 3).rem_euclid(7)) as f64 * DAY_MS + 3_600_000.0
    }

    impl Zone for Berlin {
        fn name(&self) -> &str {
            "Berlin"
        }
        fn offset(&self, utc: f64) -> f64 {
            let (y, _, _) = civil_from_days((utc / DAY_MS).floor() as i64);
            if utc >= last_sunday(y, 3) && utc < last_sunday(y, 10) { 7_200_000.0 } else { 3_600_000.0 }
        }
    }

    fn ms(y: i64, m: i64, d: i64, h: i64) -> f64 {
        (days_from_civil(y, m, d) * 86_400_000 + h * 3_600_000) as f64
    }

    #[test]
    fn civil_dates_round_trip_over_four_centuries() {
        for z in (-200_000..200_000).step_by(7) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
            assert!((1..=days_in_month(y, m)).contains(&d));
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 28), 2, "2000 is a leap year");
        assert_eq!(days_from_civil(1900, 3, 1) - days_from_civil(1900, 2, 28), 1, "1900 is not");
    }

    #[test]
    fn months_begin_on_the_first_and_end_where_the_next_begins() {
        let c = Calendar::new(Unit::Months(1), &Utc, None);
        let at = ms(2026, 11, 24, 15);
        assert_eq!(c.window_start(at), ms(2026, 11, 1, 0));
        assert_eq!(c.after(c.window_start(at), 1.0), ms(2026, 12, 1, 0));
        // A leap February is 29 days, the next one 28.
        assert_eq!(c.after(ms(2028, 2, 1, 0), 1.0) - ms(2028, 2, 1, 0), 29.0 * DAY_MS);
        assert_eq!(c.after(ms(2029, 2, 1, 0), 1.0) - ms(2029, 2, 1, 0), 28.0 * DAY_MS);
        assert_eq!(c.windows_between(ms(2026, 1, 1, 0), ms(2026, 12, 31, 23)), 11.0);
        // A quarter and a year.
        let q = Calendar::new(Unit::Months(3), &Utc, None);
        assert_eq!(q.window_start(ms(2026, 11, 24, 0)), ms(2026, 10, 1, 0));
        let y = Calendar::new(Unit::Months(12), &Utc, None);
        assert_eq!(y.window_start(ms(2026, 11, 24, 0)), ms(2026, 1, 1, 0));
    }

    #[test]
    fn an_anchor_on_the_31st_is_cut_to_each_months_last_day_and_comes_back() {
        let c = Calendar::new(Unit::Months(1), &Utc, Some(ms(2026, 1, 31, 9)));
        assert_eq!(c.window_start(ms(2026, 2, 15, 0)), ms(2026, 1, 31, 9));
        assert_eq!(c.window_start(ms(2026, 3, 1, 0)), ms(2026, 2, 28, 9));
        assert_eq!(c.window_start(ms(2028, 3, 1, 0)), ms(2028, 2, 29, 9), "a leap day");
        assert_eq!(c.window_start(ms(2026, 5, 1, 0)), ms(2026, 4, 30, 9));
        assert_eq!(c.window_start(ms(2026, 5, 31, 9)), ms(2026, 5, 31, 9));
        assert_eq!(c.window_start(ms(2026, 5, 31, 8)), ms(2026, 4, 30, 9));
    }

    #[test]
    fn weeks_start_on_monday_and_days_at_midnight() {
        let w = Calendar::new(Unit::Days(7), &Utc, None);
        // 2026-11-25 is a Wednesday; its week began on Monday the 23rd.
        assert_eq!(w.window_start(ms(2026, 11, 25, 12)), ms(2026, 11, 23, 0));
        assert_eq!(w.window_start(ms(2026, 11, 23, 0)), ms(2026, 11, 23, 0));
        let d = Calendar::new(Unit::Days(1), &Utc, None);
        assert_eq!(d.window_start(ms(2026, 11, 25, 12)), ms(2026, 11, 25, 0));
        let nine = Calendar::new(Unit::Days(1), &Utc, Some(ms(2026, 1, 1, 9)));
        assert_eq!(nine.window_start(ms(2026, 11, 25, 8)), ms(2026, 11, 24, 9));
    }

    #[test]
    fn a_day_across_a_change_of_offset_is_23_or_25_hours() {
        let d = Calendar::new(Unit::Days(1), &Berlin, None);
        // 2026-03-29: clocks go from 02:00 to 03:00 local; 2026-10-25: from 03:00 to 02:00.
        let spring = d.window_start(ms(2026, 3, 29, 12));
        assert_eq!(spring, ms(2026, 3, 28, 23), "local midnight, UTC+1");
        assert_eq!(d.after(spring, 1.0) - spring, 23.0 * 3_600_000.0);
        let autumn = d.window_start(ms(2026, 10, 25, 12));
        assert_eq!(autumn, ms(2026, 10, 24, 22), "local midnight, UTC+2");
        assert_eq!(d.after(autumn, 1.0) - autumn, 25.0 * 3_600_000.0);
        // A skipped wall-clock time lands after the gap, a repeated one is the earlier.
        assert_eq!(Berlin.utc(ms(2026, 3, 29, 2) + 1_800_000.0), ms(2026, 3, 29, 1) + 1_800_000.0);
        assert_eq!(Berlin.utc(ms(2026, 10, 25, 2) + 1_800_000.0), ms(2026, 10, 25, 0) + 1_800_000.0);
        // Every window, over two years, ends where the next begins and holds its instants.
        let m = Calendar::new(Unit::Months(1), &Berlin, None);
        for c in [d, m] {
            let mut at = ms(2026, 1, 1, 0);
            while at < ms(2028, 1, 1, 0) {
                let k = c.index(at);
                assert!(c.boundary(k) <= at && at < c.boundary(k + 1), "{c:?} {at}");
                at += 3_599_999.0;
            }
        }
    }

    #[test]
    fn windows_past_the_last_storable_instant_are_never_and_no_instant_loops() {
        for unit in [Unit::Months(1), Unit::Months(12), Unit::Days(1), Unit::Days(7)] {
            let c = Calendar::new(unit, &Berlin, None);
            assert_eq!(c.after(ms(2026, 1, 1, 0), 1e18), f64::INFINITY, "{unit:?}");
            assert_eq!(c.after(ms(2026, 1, 1, 0), f64::INFINITY), f64::INFINITY);
            assert_eq!(c.after(ms(2026, 1, 1, 0), f64::NAN), f64::INFINITY);
            for at in [f64::INFINITY, f64::NEG_INFINITY, 1e30, -1e30, END_OF_TIME_MS, f64::NAN] {
                c.index(at); // returns
            }
            assert!(c.after(ms(2026, 1, 1, 0), 1000.0).is_finite());
        }
    }

    #[test]
    fn only_whole_months_one_day_and_one_week_are_calendar_units() {
        assert_eq!(Unit::of(1, 0, 0), Some(Unit::Months(1)));
        assert_eq!(Unit::of(12, 0, 0), Some(Unit::Months(12)));
        assert_eq!(Unit::of(0, 1, 0), Some(Unit::Days(1)));
        assert_eq!(Unit::of(0, 7, 0), Some(Unit::Days(7)));
        for (months, days, micros) in [(0, 30, 0), (0, 2, 0), (0, 0, 86_400_000_000), (1, 1, 0), (0, 1, 1)] {
            assert_eq!(Unit::of(months, days, micros), None, "{months} {days} {micros}");
        }
    }
}
