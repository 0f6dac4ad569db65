//! The clock (and its setting `rate_limiter.fake_now`), and conversions between PostgreSQL's
//! time types and the millisecond numbers the bucket math uses.

use std::ffi::{CStr, CString};

use std::time::{Duration, Instant};

use pgrx::prelude::*;
use pgrx::{direct_function_call, IntoDatum};

use crate::error::Error;
use crate::settings;



/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

/// The instants PostgreSQL can store, as microseconds since 2000-01-01: from 4714-11-24 BC
/// (MIN_TIMESTAMP) up to, not including, 294277-01-01 (END_TIMESTAMP).
const PG_US_RANGE: std::ops::Range<i64> = -211_813_488_000_000_000..9_223_371_331_200_000_000;

/// Now in ms since the Unix epoch: `rate_limiter.fake_now` when set, else the real clock
/// (not the transaction's start time, which a long transaction would hold in the past).
pub fn now_ms() -> f64 {
    // SAFETY: PostgreSQL writes this variable only when the setting is assigned, never during
    // this read (backends are single-threaded); read in place, as copying it out would
    // allocate on every call. Its first byte is read only when non-null.
    let fake = unsafe { *settings::FAKE_NOW.as_ptr() };
    // SAFETY: `fake` is non-null here (checked first), so it points at PostgreSQL's
    // NUL-terminated copy of the setting, whose first byte is always readable.
    if fake.is_null() || unsafe { *fake } == 0 {
        return pg_us_to_ms(crate::unguarded::current_timestamp());
    }
    // SAFETY: non-null (checked above); a string setting is a NUL-terminated copy that
    // PostgreSQL frees only at the next assignment, which cannot happen during this call.
    let now = timestamptz_ms(parse_timestamptz(unsafe { CStr::from_ptr(fake) }));
    if !now.is_finite() {
        Error::TimeOutOfRange("rate_limiter.fake_now must be a finite timestamp".into()).raise()
    }
    now
}

/// A timestamptz's microseconds since 2000-01-01 as ms since the Unix epoch; the
/// infinities as infinities.
pub fn pg_us_to_ms(pg_us: i64) -> f64 {
    match pg_us {
        i64::MAX => f64::INFINITY,
        i64::MIN => f64::NEG_INFINITY,
        // In i128: near the ends of the range the offset overflows an i64.
        _ => (i128::from(pg_us) + i128::from(PG_EPOCH_OFFSET_US)) as f64 / 1000.0,
    }
}

/// The inverse of `pg_us_to_ms` for the instants PostgreSQL can store; `None` otherwise.
pub fn ms_to_pg_us(ms: f64) -> Option<i64> {
    let unix_us = (ms * 1000.0).round();
    // Checked as a float: the cast to i64 would saturate silently.
    let in_range = unix_us >= (PG_US_RANGE.start + PG_EPOCH_OFFSET_US) as f64
        && unix_us < (PG_US_RANGE.end as i128 + PG_EPOCH_OFFSET_US as i128) as f64;
    in_range.then(|| (unix_us as i128 - i128::from(PG_EPOCH_OFFSET_US)) as i64)
}

pub fn timestamptz_ms(ts: TimestampWithTimeZone) -> f64 {
    pg_us_to_ms(ts.into_inner())
}

/// `ms` as a timestamptz; instants PostgreSQL cannot store as infinity.
pub fn ms_timestamptz(ms: f64) -> TimestampWithTimeZone {
    ms_to_pg_us(ms)
        .and_then(|us| TimestampWithTimeZone::try_from(us).ok())
        .unwrap_or(if ms < 0.0 { TimestampWithTimeZone::negative_infinity() } else { TimestampWithTimeZone::positive_infinity() })
}

/// An interval as milliseconds, counting a month as 30 days and a year as 365.25 days,
/// as `EXTRACT(epoch FROM interval)` does.
pub fn interval_ms(interval: Interval) -> f64 {
    let months = f64::from(interval.months());
    let days = f64::from(interval.days()) + (months / 12.0).trunc() * 365.25 + (months % 12.0) * 30.0;
    days * 86_400_000.0 + interval.micros() as f64 / 1000.0
}

/// An interval as PostgreSQL prints it.
pub fn interval_text(interval: Interval) -> String {
    // SAFETY: interval_out with an interval datum returns a palloc'd NUL-terminated text.
    unsafe {
        let text = direct_function_call::<&CStr>(pg_sys::interval_out, &[interval.into_datum()]);
        text.map_or_else(String::new, |t| t.to_string_lossy().into_owned())
    }
}

/// Parse interval text such as `'1 minute'` with PostgreSQL's own input function.
pub fn parse_interval(text: &str) -> Interval {
    let c = CString::new(text).unwrap_or_default();
    // SAFETY: interval_in with a NUL-terminated text, no type OID and no typmod, as SQL calls it.
    unsafe {
        direct_function_call::<Interval>(
            pg_sys::interval_in,
            &[c.as_c_str().into_datum(), pg_sys::InvalidOid.into_datum(), (-1i32).into_datum()],
        )
    }
    .expect("interval_in never returns NULL")
}

/// Parse timestamptz text with PostgreSQL's own input function.
pub fn parse_timestamptz(text: &CStr) -> TimestampWithTimeZone {
    // SAFETY: timestamptz_in with a NUL-terminated text, no type OID and no typmod.
    unsafe {
        direct_function_call::<TimestampWithTimeZone>(
            pg_sys::timestamptz_in,
            &[text.into_datum(), pg_sys::InvalidOid.into_datum(), (-1i32).into_datum()],
        )
    }
    .expect("timestamptz_in never returns NULL")
}

/// Sleep on the process latch for `ms`, waking early only to serve interrupts (which
/// `statement_timeout` and `pg_cancel_backend` raise here).
pub fn sleep_ms(ms: f64) {
    // Whatever the caller computed: no NaN, nothing before now, nothing past a year.
    let ms = if ms > 0.0 { ms.min(365.0 * 86_400_000.0) } else { 0.0 };
    let until = Instant::now() + Duration::from_secs_f64(ms / 1000.0);
    loop {
        check_for_interrupts!();
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32;
        // SAFETY: MyLatch is this process's own latch, set up at process start, and only its
        // owner may wait on it; it is reset after each wakeup, before the next check for
        // interrupts, the order latch.h prescribes.
        unsafe {
            // WaitLatch takes at most INT_MAX ms (asserted): a longer sleep is several waits.
            let timeout = left.as_millis().clamp(1, i32::MAX as u128) as i64;
            pg_sys::WaitLatch(pg_sys::MyLatch, events, timeout, pg_sys::PG_WAIT_EXTENSION);
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
    }
}
