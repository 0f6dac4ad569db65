//! PostgreSQL's time zones for calendar windows: the zones `SET timezone` takes, looked up
//! with `pg_tzset`, one `PgZone` per zone per backend.

use std::ffi::{CStr, CString};

use pgrx::pg_sys;

use crate::bucket::calendar::{Utc, Zone};

/// A time zone PostgreSQL knows (`pg_tzset`: the zone names of `SET timezone`), for
/// calendar windows.
struct PgZone {
    name: String,
    tz: *mut pg_sys::pg_tz,
}

impl Zone for PgZone {
    fn name(&self) -> &str {
        &self.name
    }

    fn offset(&self, utc_ms: f64) -> f64 {
        let seconds = (utc_ms / 1000.0).floor() as pg_sys::pg_time_t;
        // SAFETY: `tz` came from pg_tzset, whose zones live as long as the process;
        // pg_localtime reads `seconds` and returns its static result, read at once, or NULL
        // for an instant it cannot place.
        let local = unsafe { pg_sys::pg_localtime(&seconds, self.tz) };
        if local.is_null() {
            return 0.0;
        }
        // SAFETY: not NULL, as just checked.
        unsafe { (*local).tm_gmtoff as f64 * 1000.0 }
    }
}

/// The most zone names one backend looks up: each new name may make PostgreSQL load a zone
/// for the process's life (a POSIX-style name such as `<A>-1` is a new one every time), so a
/// caller cannot make a backend grow without end by naming zones.
pub const MAX_NAMES: usize = 1000;

thread_local! {
    /// The zones this backend has looked up, by the name asked for; one `PgZone` per
    /// PostgreSQL zone, shared by its spellings.
    static ZONES: std::cell::RefCell<std::collections::HashMap<String, &'static PgZone>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
    static BY_TZ: std::cell::RefCell<std::collections::HashMap<usize, &'static PgZone>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// The time zone called `name` (`None` and `'UTC'` are UTC); `None` when PostgreSQL knows no
/// such zone, or this backend has looked up `MAX_NAMES` others.
pub fn named(name: Option<&str>) -> Option<&'static dyn Zone> {
    let Some(name) = name.filter(|n| !n.eq_ignore_ascii_case("UTC")) else { return Some(&Utc) };
    if let Some(found) = ZONES.with(|z| z.borrow().get(name).copied()) {
        return Some(found);
    }
    if ZONES.with(|z| z.borrow().len()) >= MAX_NAMES {
        return None;
    }
    let c = CString::new(name).ok()?;
    // SAFETY: pg_tzset takes a NUL-terminated name and returns a zone it keeps for the
    // process's life, or NULL.
    let tz = unsafe { pg_sys::pg_tzset(c.as_ptr()) };
    // SAFETY: a zone pg_tzset returned.
    if tz.is_null() || !unsafe { pg_sys::pg_tz_acceptable(tz) } {
        return None;
    }
    let found = BY_TZ.with(|z| {
        *z.borrow_mut().entry(tz as usize).or_insert_with(|| {
            // SAFETY: pg_get_timezone_name returns the zone's own NUL-terminated name.
            let name = unsafe { CStr::from_ptr(pg_sys::pg_get_timezone_name(tz)) }.to_string_lossy().into_owned();
            Box::leak(Box::new(PgZone { name, tz }))
        })
    });
    ZONES.with(|z| z.borrow_mut().insert(name.to_owned(), found));
    Some(found)
}
