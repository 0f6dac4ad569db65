//! Every error the extension raises, each with its SQLSTATE, detail and hint: the `Error`
//! enum for standard codes, and `raise_rate_limited` for the custom `RL429`.

use std::ffi::{c_char, c_int};

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{pg_sys, PgLogLevel, PgSqlErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Rate limit {name} count {count} exceeds {max}.")]
    CountExceedsMax { name: String, count: f64, max: String },

    #[error("rate limit \"{0}\" does not exist")]
    UnknownLimit(String),

    #[error("tier \"{tier}\" of rate limit \"{name}\" does not exist")]
    UnknownTier { name: String, tier: String },

    #[error("tier \"{tier}\" of rate limit \"{name}\" is named by {overrides} override(s)")]
    TierInUse { name: String, tier: String, overrides: i64 },

    #[error("invalid rate limit argument: {0}")]
    InvalidArgument(String),

    #[error("invalid rate limit config: {0}")]
    InvalidConfig(String),

    #[error("rate limit number out of range: {0}")]
    OutOfRange(String),

    #[error("invalid calendar window: {0}")]
    Calendar(String),

    #[error("malformed rate limit config: {0}")]
    MalformedConfig(String),

    #[error("could not serialize access due to concurrent update")]
    SerializationFailure,

    #[error("rate_limiter's SQL objects are older than its library")]
    ExtensionOutdated,

    #[error("rate_limiter.state has an index, trigger or column the extension did not create")]
    StateTableChanged,

    #[error("instant out of range: {0}")]
    TimeOutOfRange(String),

    #[error("not supported: {0}")]
    NotSupported(String),

    #[error("not supported: {0}")]
    Concurrency(String),

    #[error("rate_limiter's {what} is owned by role \"{role}\", which neither owns the extension nor is a superuser")]
    UntrustedOwner { what: String, role: String },

    #[error("{0} is not an object of the extension rate_limiter")]
    NotAMember(String),

    #[error("{0} does not exist: the extension was dropped, or its table, while this call waited for it")]
    RelationGone(String),

    #[error("permission denied for {0}: it shows every database's limit names and keys")]
    NotAMonitor(String),

    #[error("{relation} is not shaped as the extension made it: {detail}")]
    ShapeChanged { relation: String, detail: String },

    #[error("hot limits need shared memory: rate_limiter is not in shared_preload_libraries, or rate_limiter.hot_keys is 0")]
    HotUnavailable,

    #[error("every one of the rate_limiter.hot_keys entries holds a hot (name, key) with calls in flight")]
    HotKeysFull,

    #[error("not supported: taking or ending a concurrency limit's slots on a logical subscriber of rate_limiter.leases")]
    SlotsOnSubscriber,

    #[error("this transaction holds {held} concurrency slots and asks for {asked} more, over rate_limiter.max_slots_per_transaction ({max})")]
    SlotsPerTransaction { held: u32, asked: u32, max: u32 },

    #[error("this transaction has locked {0} keys of memory limits outside shared memory, the most rate_limiter.max_memory_key_locks_per_transaction allows")]
    MemoryKeyLocksPerTransaction(u32),

    #[error("this database holds its {0} of the rate_limiter.hot_keys entries, each a hot (name, key) with calls in flight")]
    HotKeysShareFull(usize),

    #[error("the limit \"{0}\" changed while calls to it were in flight")]
    ConfigRace(String),

    #[error("cannot PREPARE a transaction that called a hot or memory limit")]
    PreparedInFlight,

    #[error("the hot or memory limit \"{0}\" was reset or changed earlier in this transaction")]
    ChangedHere(String),

    #[error("memory limits need shared memory: rate_limiter is not in shared_preload_libraries, or rate_limiter.memory_keys is 0")]
    MemoryUnavailable,

    #[error("no rate_limiter.memory_keys entry is free for a new key{}", share.map_or(String::new(), |n| format!(": this database holds its {n} of the entries of the key's partition")))]
    MemoryKeysFull { share: Option<usize> },

    #[error("too many databases loaded memory limits' snapshots since the last crash or promotion")]
    MemoryDatabasesFull,

    #[error("rate_limiter will not write {table}: it has {what}, which the extension did not create")]
    PlantedCode { table: String, what: String },

    #[error("permission denied to limit the writes of {0}")]
    WriteLimitDenied(String),

    #[error("a write limit's column: {0}")]
    WriteLimitColumn(String),
}

impl Error {
    /// The SQLSTATE's five characters, as a client reads them (MAKE_SQLSTATE's six bits per
    /// character, unpacked): what the test vectors say an error is.
    #[cfg(any(test, feature = "pg_test"))]
    pub fn code(&self) -> String {
        let packed = self.sqlstate() as i32;
        (0..5).map(|i| char::from(b'0' + ((packed >> (6 * i)) & 0x3f) as u8)).collect()
    }

    fn sqlstate(&self) -> PgSqlErrorCode {
        match self {
            Error::CountExceedsMax { .. }
            | Error::InvalidArgument(_)
            | Error::InvalidConfig(_)
            | Error::OutOfRange(_)
            | Error::Calendar(_) => {
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
            }
            Error::UnknownLimit(_) | Error::UnknownTier { .. } => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            Error::RelationGone(_) => PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            Error::TierInUse { .. } => PgSqlErrorCode::ERRCODE_FOREIGN_KEY_VIOLATION,
            Error::NotSupported(_) | Error::Concurrency(_) | Error::SlotsOnSubscriber => {
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED
            }
            Error::MalformedConfig(_) => PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION,
            Error::SerializationFailure => PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            Error::ExtensionOutdated | Error::StateTableChanged => {
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            Error::TimeOutOfRange(_) => PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
            Error::UntrustedOwner { .. } | Error::NotAMonitor(_) | Error::WriteLimitDenied(_) => {
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE
            }
            Error::WriteLimitColumn(_) => PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            Error::NotAMember(_)
            | Error::ShapeChanged { .. }
            | Error::HotUnavailable
            | Error::MemoryUnavailable
            | Error::ConfigRace(_)
            | Error::PlantedCode { .. } => {
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            Error::HotKeysFull
            | Error::HotKeysShareFull(_)
            | Error::MemoryKeysFull { .. }
            | Error::MemoryDatabasesFull
            | Error::SlotsPerTransaction { .. }
            | Error::MemoryKeyLocksPerTransaction(_) => {
                PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED
            }
            Error::PreparedInFlight | Error::ChangedHere(_) => PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
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
            Error::UnknownTier { .. } => "Define it with rate_limiter.define_tier(name, tier, rate => ..., period => ...).",
            Error::TierInUse { .. } => {
                "Move those keys to another tier or their own numbers with rate_limiter.override(), or remove_override() them, first."
            }
            Error::InvalidArgument(_) => {
                "name must be a non-empty text of at most 128 bytes other than *other*, key at \
                 most 1024 bytes, count a finite number >= 0; rate_limit_all takes at most 1000 limits."
            }
            Error::InvalidConfig(_) | Error::MalformedConfig(_) => {
                "A config looks like {\"kind\": \"token bucket\", \"rate\": 10, \"period\": 60000}: \
                 kind 'token bucket', 'fixed window', 'sliding window', 'rolling window' or \
                 'concurrency', rate > 0, period > 0 (ms \
                 or interval text), optional capacity >= 0, maxReserved >= 0, shards >= 1, start \
                 (ms since epoch)."
            }
            Error::Calendar(_) => {
                "A fixed window whose period is whole months ('1 month', '3 months', '1 year'), \
                 '1 day' or '1 week' starts its windows on the calendar, in the time zone tz \
                 (default UTC; a name PostgreSQL knows, such as 'Europe/Berlin'), at start's day \
                 and time when given. The other kinds count fixed lengths: give them one, such as \
                 '30 days'. Inline configs of one session may name at most 100 POSIX-style zone \
                 specs (such as '<+03>-3'); zones of the tz database, and named limits' zones, \
                 are never counted."
            }
            Error::OutOfRange(_) => {
                "rate, capacity, maxReserved, a count and a credit are at most 1e15; a period is \
                 1 ms to 100 years, minGap and denyCache at most 100 years, lockTimeout at most \
                 2147483647 ms (as PostgreSQL's lock_timeout); a rolling window's cells are at \
                 least 1 ms (period / buckets); a lease at most rate_limiter.max_lease (a day \
                 unless a superuser set it longer). A limit defined before these bounds: define \
                 it again within them."
            }
            Error::SerializationFailure => {
                "Another transaction changed this rate limit's state after yours took its snapshot; \
                 retry the transaction (or use READ COMMITTED, where the call waits instead)."
            }
            Error::ExtensionOutdated => "Run ALTER EXTENSION rate_limiter UPDATE.",
            Error::StateTableChanged => {
                "The extension writes rate_limiter.state itself: it keeps its unique index (and \
                 copies REINDEX CONCURRENTLY makes), fires no triggers and writes its own columns. \
                 Drop the index or trigger that was added, or undo the ALTER TABLE; if that is not \
                 possible, DROP EXTENSION rate_limiter and create it again (state is lost, limits \
                 are not if you save rate_limiter.limits first)."
            }
            Error::NotSupported(_) => {
                "Reservations (reserve => true, maxReserved) need a token bucket or a fixed window in \
                 mode 'all'; minGap, modes other than 'all', lockTimeout and denyCache need \
                 shards = 1; denyCache needs mode 'all'; rate_limit_all takes limits in mode 'all' only. \
                 A hot limit is named, shards = 1, mode 'all', without minGap or lockTimeout, and takes \
                 no credit and no part in rate_limit_all. A memory limit (durable false) is a token \
                 bucket, fixed or sliding window, shards = 1, mode 'all', without minGap or lockTimeout. A limit in shadow mode (enforce false) takes \
                 no part in rate_limit_all either: call it on its own, or SET rate_limiter.shadow \
                 for the whole call."
            }
            Error::Concurrency(_) => {
                "A concurrency limit (kind 'concurrency', rate = the most slots held at once, \
                 1 to 1000) is taken with rate_limit or acquire (a slot until the transaction \
                 ends, or a lease) and given back by the transaction's end or release(). It has \
                 no reservations, credit, shards, modes, minGap, lockTimeout, denyCache or hot, \
                 takes no part in rate_limit_all, and counts whole slots; acquire, release and \
                 renew take only a concurrency limit."
            }
            Error::UntrustedOwner { .. } => {
                "A role that owns the extension's schema or tables could replace or rename what \
                 the extension runs as its callers; give them back with ALTER SCHEMA or ALTER \
                 TABLE ... OWNER TO the extension's owner, or DROP EXTENSION rate_limiter and \
                 create it again in a schema the installing role owns."
            }
            Error::NotAMonitor(_) => {
                "Only superusers and members of pg_monitor may read every database's statistics: \
                 GRANT pg_monitor TO the role, or read rate_limiter.stats and rate_limiter.top_denied \
                 in each database."
            }
            Error::NotAMember(_) => {
                "An object of that name exists in the extension's schema but the extension did not \
                 create it: drop the look-alike and restore the extension's own object, or DROP \
                 EXTENSION rate_limiter and create it again."
            }
            Error::RelationGone(_) => {
                "DROP EXTENSION rate_limiter committed (or a DROP of one of its tables): once \
                 CREATE EXTENSION rate_limiter has run again, call again; a table dropped alone \
                 comes back only with DROP EXTENSION rate_limiter and CREATE EXTENSION."
            }
            Error::ShapeChanged { .. } => {
                "The extension reads and writes its tables and type column by column, by position: \
                 undo the ALTER TABLE or ALTER TYPE (the columns as sql/bootstrap.sql creates them), \
                 or save rate_limiter.limits and rate_limiter.blocks, DROP EXTENSION rate_limiter \
                 and create it again."
            }
            Error::HotUnavailable => {
                "Add rate_limiter to shared_preload_libraries with rate_limiter.hot_keys > 0 and \
                 restart, or define the limit with hot => false (and shards to spread it)."
            }
            Error::HotKeysFull => {
                "Raise rate_limiter.hot_keys (a restart), or end the transactions that hold hot \
                 calls open (see pg_stat_activity for sessions idle in transaction)."
            }
            Error::SlotsOnSubscriber => {
                "Its leases arrive from the publisher, which never sees this server's slots, and a \
                 lease written here could collide with a replicated one and stop replication. \
                 Take, release and renew slots on the publisher (check_rate_limit here sees its \
                 leases once applied), or subscribe to rate_limiter.limits alone."
            }
            Error::SlotsPerTransaction { .. } => {
                "Each slot a transaction holds is an entry of the server's shared lock table, which \
                 every database shares. Hold fewer at once: end the transaction, or take slots by \
                 lease in transactions of their own (a committed lease holds its slots with no \
                 lock). A superuser may raise rate_limiter.max_slots_per_transaction, well inside \
                 max_locks_per_transaction."
            }
            Error::MemoryKeyLocksPerTransaction(_) => {
                "A key of a memory limit that finds no room in shared memory is counted in its row, \
                 locked until the transaction ends: an entry of the server's shared lock table, \
                 which every database shares. Call fewer such keys in one transaction, give memory \
                 limits more room (rate_limiter.memory_keys, rate_limiter.memory_keys_per_database), \
                 or, as a superuser, raise rate_limiter.max_memory_key_locks_per_transaction, well \
                 inside max_locks_per_transaction."
            }
            Error::HotKeysShareFull(_) => {
                "Raise rate_limiter.hot_keys_per_database (a superuser setting; by default half of \
                 rate_limiter.hot_keys), or end this database's transactions that hold hot calls \
                 open (see pg_stat_activity for sessions idle in transaction)."
            }
            Error::ConfigRace(_) => {
                "A change of a hot or memory limit waits for the calls in flight; retry the call."
            }
            Error::PreparedInFlight => {
                "A hot or memory call's tokens are settled when its own session commits or aborts; \
                 commit the transaction directly, or call a durable limit that is not hot before \
                 PREPARE TRANSACTION."
            }
            Error::ChangedHere(_) => {
                "reset_rate_limit and define() of a hot or memory limit reach its calls when their \
                 transaction commits: commit first and call it in a later transaction, or roll back \
                 to a savepoint taken before the change."
            }
            Error::MemoryUnavailable => {
                "Add rate_limiter to shared_preload_libraries with rate_limiter.memory_keys > 0 and \
                 restart, or define the limit with durable => true."
            }
            Error::MemoryKeysFull { .. } => {
                "Every entry holds a key whose tokens are still counted; none is admitted rather than \
                 one forgotten. Raise rate_limiter.memory_keys (a restart) or \
                 rate_limiter.memory_keys_per_database, or make the limit durable."
            }
            Error::MemoryDatabasesFull => {
                "Shared memory keeps which databases loaded their counts for 1024 of them: restart the \
                 server cleanly, or make some of the limits durable."
            }
            Error::PlantedCode { .. } => {
                "The extension writes its tables with its owner's rights, which a trigger or rule on \
                 them would run with. Drop it (DROP TRIGGER ... ON the table), and grant no TRIGGER \
                 on the extension's tables (docs/security.md)."
            }
            Error::WriteLimitDenied(_) => {
                "limit_writes and unlimit_writes change the table's triggers, which charge the \
                 limit with the extension's rights for whoever writes: run them as the table's \
                 owner (or a member of its role), granted EXECUTE on rate_limiter.rate_limit."
            }
            Error::WriteLimitColumn(_) => {
                "key names a column of the table of a type whose text no setting changes (text, \
                 integers, numeric, uuid, boolean, network addresses, enums; NULL is one key of its \
                 own) and count a column of an integer, numeric or floating-point type (each row \
                 counts 1 without it). For an expression, add a generated column (GENERATED \
                 ALWAYS AS (...) STORED) and name it."
            }
            Error::TimeOutOfRange(_) => {
                "Instants must lie between 4714 BC and 294276 AD: use a finite start and \
                 rate_limiter.fake_now, and a period that keeps windows inside that range."
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

/// A SQLSTATE packed as PostgreSQL's MAKE_SQLSTATE does: six bits per character.
const fn packed(code: &[u8; 5]) -> c_int {
    let mut packed = 0;
    let mut i = 0;
    while i < 5 {
        packed |= ((code[i] - b'0') as c_int & 0x3f) << (6 * i);
        i += 1;
    }
    packed
}

/// The extension's own SQLSTATE of a denial that throws.
pub const RL429: c_int = packed(b"RL429");
/// PostgREST answers a `PTxyz` with HTTP status xyz.
pub const PT429: c_int = packed(b"PT429");
/// PostgREST takes a `PGRST` error's message as the response's body and its detail as the
/// status and headers.
pub const PGRST: c_int = packed(b"PGRST");

// PostgreSQL's error functions, declared here without pgrx's guard: pgrx re-raises an
// error it catches through a closed enum of standard SQLSTATEs, which turns RL429 into XX000.
#[allow(clashing_extern_declarations)]
extern "C-unwind" {
    #[link_name = "errstart"]
    fn pg_errstart(elevel: c_int, domain: *const c_char) -> bool;
    #[link_name = "errcode"]
    fn pg_errcode(sqlerrcode: c_int) -> c_int;
    #[link_name = "errmsg"]
    fn pg_errmsg(fmt: *const c_char, ...) -> c_int;
    #[link_name = "errdetail"]
    fn pg_errdetail(fmt: *const c_char, ...) -> c_int;
    #[link_name = "errhint"]
    fn pg_errhint(fmt: *const c_char, ...) -> c_int;
    #[link_name = "errfinish"]
    fn pg_errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
}

/// Raise a denial (`RL429`, or PostgREST's `PT429` or `PGRST`) with PostgreSQL-allocated texts.
///
/// # Safety
/// This longjmps out of the caller. Call it only from an fmgr entry point's own frame that
/// holds nothing to drop, never inside a pgrx-guarded function.
pub unsafe fn raise_rate_limited(code: c_int, message: *const c_char, detail: *const c_char, hint: *const c_char) -> ! {
    // SAFETY: PostgreSQL's ereport sequence with "%s" formats and NUL-terminated texts; the
    // caller's frame has nothing to drop when errfinish longjmps out of it.
    unsafe {
        if pg_errstart(pg_sys::PGERROR as c_int, std::ptr::null()) {
            pg_errcode(code);
            pg_errmsg(c"%s".as_ptr(), message);
            pg_errdetail(c"%s".as_ptr(), detail);
            pg_errhint(c"%s".as_ptr(), hint);
            pg_errfinish(c"src/error.rs".as_ptr(), line!() as c_int, c"rate_limit".as_ptr());
        }
    }
    unreachable!("an ERROR does not return")
}
