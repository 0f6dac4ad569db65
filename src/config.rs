//! Limit configs: parsing a `rate_limiter.limits` row or an inline jsonb object
//! (`config/parse.rs`), validating it (`config/validate.rs`), rendering the effective config
//! back as jsonb and the fingerprint that keeps an inline config's state apart from every
//! other config's (`config/fingerprint.rs`), a key's override applied to its limit's row
//! (`config/overrides.rs`), and the settings a call reads about its config.

use crate::bucket::Config;
use crate::settings;

mod fingerprint;
mod overrides;
mod parse;
mod validate;
mod zone;

pub use fingerprint::{fingerprint, to_json};
pub use overrides::Override;
pub use parse::{from_json, JsonbArg, LimitRow};
pub use validate::MAX_AMOUNT;

/// Why a limit's overrides can have no end (`until`), if they cannot: the end of an override
/// of a hot, memory or concurrency limit would change its key's numbers under calls in flight
/// (a hot key's logged debits, a memory key's escrow, the slots a boost let be taken) with
/// nothing to wait for them; `remove_override()` waits, as a redefinition does.
pub fn no_end_for(concurrency: bool, hot: bool, durable: bool) -> Option<&'static str> {
    if hot {
        Some("hot")
    } else if !durable {
        Some("memory")
    } else if concurrency {
        Some("concurrency")
    } else {
        None
    }
}

/// `rate_limiter.max_lease`, in ms.
pub fn max_lease_ms() -> f64 {
    f64::from(settings::MAX_LEASE.get()) * 1000.0
}

/// `rate_limiter.max_slots_per_transaction`.
pub fn max_slots_per_transaction() -> u32 {
    settings::MAX_SLOTS_PER_TRANSACTION.get() as u32
}

/// Whether a call under `config` answers a denial in shadow mode: the limit's `enforce`
/// is off, or the session's `rate_limiter.shadow` on.
pub fn shadow(config: &Config) -> bool {
    !config.enforce || settings::SHADOW.get()
}

/// Whether the session is in shadow mode (`rate_limiter.shadow`).
pub fn shadow_session() -> bool {
    settings::SHADOW.get()
}
