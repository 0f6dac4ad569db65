//! The clock, and conversions between PostgreSQL's time types and the millisecond numbers
//! the bucket math uses.

use std::ffi::{CStr, CString};

use pgrx::prelude::*;
use pgrx::{direct_function_call, IntoDatum};

use crate::FAKE_NOW;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

/// Now in ms since the Unix epoch: `rate_limiter.fake_now` when set, else the real clock
/// (not the transaction's start time, which a long transaction would hold in the past).
pub fn now_ms() -> f64 {
    // Read the setting in place: copying it out would allocate on every call.
    let fake = unsafe { *FAKE_NOW.as_ptr() };
    if fake.is_null() || unsafe { *fake } == 0 {
        return pg_us_to_ms(unsafe { pg_sys::GetCurrentTimestamp() });
    }
    timestamptz_ms(parse_timestamptz(unsafe { CStr::from_ptr(fake) }))
}

/// A timestamptz's microseconds since 2000-01-01 as ms since the Unix epoch.
pub fn pg_us_to_ms(pg_us: i64) -> f64 {
    (pg_us + PG_EPOCH_OFFSET_US) as f64 / 1000.0
}

/// The inverse of `pg_us_to_ms`.
pub fn ms_to_pg_us(ms: f64) -> i64 {
    (ms * 1000.0).round() as i64 - PG_EPOCH_OFFSET_US
}

pub fn timestamptz_ms(ts: TimestampWithTimeZone) -> f64 {
    pg_us_to_ms(ts.into_inner())
}

pub fn ms_timestamptz(ms: f64) -> TimestampWithTimeZone {
    // Values come from finite configs and clocks, so they are always in range.
    TimestampWithTimeZone::try_from(ms_to_pg_us(ms)).unwrap_or(TimestampWithTimeZone::positive_infinity())
}

/// An interval as milliseconds, counting a month as 30 days and a year as 365.25 days,
/// as `EXTRACT(epoch FROM interval)` does.
pub fn interval_ms(interval: Interval) -> f64 {
    let months = f64::from(interval.months());
    let days = f64::from(interval.days()) + (months / 12.0).trunc() * 365.25 + (months % 12.0) * 30.0;
    days * 86_400_000.0 + interval.micros() as f64 / 1000.0
}

/// Parse interval text such as `'1 minute'` with PostgreSQL's own input function.
pub fn parse_interval(text: &str) -> Interval {
    let c = CString::new(text).unwrap_or_default();
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
    unsafe {
        direct_function_call::<TimestampWithTimeZone>(
            pg_sys::timestamptz_in,
            &[text.into_datum(), pg_sys::InvalidOid.into_datum(), (-1i32).into_datum()],
        )
    }
    .expect("timestamptz_in never returns NULL")
}
