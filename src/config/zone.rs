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

/// Who names a zone: a named limit (an administrator's choice, never refused whatever
/// inline configs looked up before), or a caller's inline config.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum NamedBy {
    Limit,
    Inline,
}

/// Why no zone was found.
pub enum Refused {
    /// PostgreSQL knows no zone of that name.
    Unknown,
    /// An inline config named a POSIX-style spec after this backend had loaded
    /// `MAX_SPECS` others for inline configs.
    TooManySpecs,
}

/// The most POSIX-style zone specs (`<+03>-3`, `XYZ5`) inline configs may make one backend
/// load: PostgreSQL keeps each new one for the process's life, and there is no end to their
/// spellings. The zones of the tz database are a fixed set, and a named limit's zone is an
/// administrator's choice: neither is ever refused.
pub const MAX_SPECS: usize = 100;

thread_local! {
    /// The zones this backend has looked up, by the name asked for in upper case (as
    /// PostgreSQL's own cache is keyed: `europe/berlin` and `Europe/Berlin` are one); one
    /// `PgZone` per PostgreSQL zone, shared by its spellings.
    static ZONES: std::cell::RefCell<std::collections::HashMap<String, &'static PgZone>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
    /// Never dropped, as the zones it owns live as long as the process: were its destructor
    /// to run at exit, the zones would be lost memory (Valgrind's definite leaks).
    static BY_TZ: std::mem::ManuallyDrop<std::cell::RefCell<std::collections::HashMap<usize, &'static PgZone>>> =
        std::mem::ManuallyDrop::new(std::cell::RefCell::new(std::collections::HashMap::new()));
    /// POSIX-style specs loaded for inline configs.
    static SPECS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The time zone called `name` (`None` and `'UTC'` are UTC).
pub fn named(name: Option<&str>, by: NamedBy) -> Result<&'static dyn Zone, Refused> {
    let Some(name) = name.filter(|n| !n.eq_ignore_ascii_case("UTC")) else { return Ok(&Utc) };
    let upper = name.to_ascii_uppercase();
    if let Some(found) = ZONES.with(|z| z.borrow().get(&upper).copied()) {
        return Ok(found);
    }
    let inline = by == NamedBy::Inline;
    // Only past the bound does it matter whether a new name is a zone of the tz database,
    // which takes reading it whole (once per backend).
    if inline && SPECS.get() >= MAX_SPECS && !in_tz_database(&upper) {
        return Err(Refused::TooManySpecs);
    }
    let c = CString::new(name).map_err(|_| Refused::Unknown)?;
    // SAFETY: pg_tzset takes a NUL-terminated name and returns a zone it keeps for the
    // process's life, or NULL.
    let tz = unsafe { pg_sys::pg_tzset(c.as_ptr()) };
    // SAFETY: a zone pg_tzset returned.
    if tz.is_null() || !unsafe { pg_sys::pg_tz_acceptable(tz) } {
        return Err(Refused::Unknown);
    }
    let found = BY_TZ.with(|z| {
        *z.borrow_mut().entry(tz as usize).or_insert_with(|| {
            // SAFETY: pg_get_timezone_name returns the zone's own NUL-terminated name.
            let name = unsafe { CStr::from_ptr(pg_sys::pg_get_timezone_name(tz)) }.to_string_lossy().into_owned();
            Box::leak(Box::new(PgZone { name, tz }))
        })
    });
    // pg_tzset names a zone of the tz database as its file is spelled, and a POSIX-style
    // spec in upper case: a name that comes back in upper case is counted as a spec (the
    // few such zones of the database, EST5EDT or CET, count too until the bound).
    if inline && found.name == upper {
        SPECS.set(SPECS.get() + 1);
    }
    ZONES.with(|z| z.borrow_mut().insert(upper, found));
    Ok(found)
}

thread_local! {
    /// The names of the tz database's zones, in upper case, read on first need.
    static TZ_DATABASE: std::cell::OnceCell<std::collections::HashSet<String>> = const { std::cell::OnceCell::new() };
}

/// Whether `upper` (a name in upper case) is a zone of the tz database the server reads, as
/// `pg_timezone_names` lists them; anything else PostgreSQL accepts is a POSIX-style spec.
fn in_tz_database(upper: &str) -> bool {
    TZ_DATABASE.with(|names| {
        names
            .get_or_init(|| {
                let mut names = std::collections::HashSet::new();
                // SAFETY: the enumeration pg_timezone_names uses: started, read to its end
                // (each zone it returns is valid until the next call, and its name is
                // copied at once), then ended, which frees it.
                unsafe {
                    let dir = pg_sys::pg_tzenumerate_start();
                    loop {
                        pgrx::check_for_interrupts!();
                        let tz = pg_sys::pg_tzenumerate_next(dir);
                        if tz.is_null() {
                            break;
                        }
                        names.insert(CStr::from_ptr(pg_sys::pg_get_timezone_name(tz)).to_string_lossy().to_ascii_uppercase());
                    }
                    pg_sys::pg_tzenumerate_end(dir);
                }
                names
            })
            .contains(upper)
    })
}
