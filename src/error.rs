//! Every error the extension raises from Rust, each with its SQLSTATE, detail and hint.
//! (`RL429`, rate limited, is not here: pgrx can only raise standard codes, so the
//! PL/pgSQL layer in `sql/finalize.sql` raises it.)

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Rate limit {name} count {count} exceeds {max}.")]
    CountExceedsMax { name: String, count: f64, max: String },

    #[error("rate limit \"{0}\" does not exist")]
    UnknownLimit(String),

    #[error("invalid rate limit argument: {0}")]
    InvalidArgument(String),

    #[error("invalid rate limit config: {0}")]
    InvalidConfig(String),

    #[error("malformed rate limit config: {0}")]
    MalformedConfig(String),
}

impl Error {
    fn sqlstate(&self) -> PgSqlErrorCode {
        match self {
            Error::CountExceedsMax { .. } | Error::InvalidArgument(_) | Error::InvalidConfig(_) => {
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
            }
            Error::UnknownLimit(_) => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            Error::MalformedConfig(_) => PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION,
        }
    }

    fn hint(&self) -> &'static str {
        match self {
            Error::CountExceedsMax { .. } => {
                "No call can take more than the capacity (plus max_reserved when reserving); \
                 raise capacity or split the work into smaller counts."
            }
            Error::UnknownLimit(_) => {
                "Define it with rate_limiter.define(name, kind, rate, period) or pass config => '{...}'::jsonb."
            }
            Error::InvalidArgument(_) => {
                "name must be a non-empty text of at most 128 bytes, key at most 1024 bytes, \
                 count a finite number >= 0."
            }
            Error::InvalidConfig(_) | Error::MalformedConfig(_) => {
                "A config looks like {\"kind\": \"token bucket\", \"rate\": 10, \"period\": 60000}: \
                 kind 'token bucket' or 'fixed window', rate > 0, period > 0 (ms or interval text), \
                 optional capacity >= 0, maxReserved >= 0, shards >= 1, start (ms since epoch)."
            }
        }
    }

    /// Raise this error as a PostgreSQL ERROR; the current transaction aborts.
    pub fn raise(self) -> ! {
        let mut report = ErrorReport::new(self.sqlstate(), self.to_string(), "rate_limiter")
            .set_hint(self.hint());
        if let Error::CountExceedsMax { count, .. } = &self {
            report = report.set_detail(format!("count = {count}"));
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("ERROR does not return")
    }
}

pub type Result<T> = std::result::Result<T, Error>;
