//! Every setting of rate_limiter in one place: its name, default, bounds, context and the
//! text `SHOW`/`pg_settings` gives (docs/operations.md lists them, and the test command's first
//! step checks that it lists each as here). The modules that use a setting read it here.

use std::ffi::CString;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::PostgresGucEnum;

/// The most slots a concurrency limit may have (its rate), and so the most one transaction
/// may be allowed: a call probes each of them once, so this bounds the work one call does
/// while it keeps others from searching the same key.
pub const MAX_SLOTS: f64 = 1000.0;

/// `rate_limiter.fake_now`: a timestamptz the limiter takes as now; empty means the real clock.
pub static FAKE_NOW: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// `rate_limiter.shadow`: every limit of the session in shadow mode. Superuser-only, and
/// grantable (`GRANT SET ON PARAMETER`): were any role able to set it, a role that inserts
/// through a policy or trigger that calls `rate_limit` could turn the limit off for itself.
pub static SHADOW: GucSetting<bool> = GucSetting::<bool>::new(false);

/// How a denial that throws (`throws => true`, a write limit) is raised: `RL429`, the
/// extension's own SQLSTATE; `PT429`, which PostgREST answers with HTTP 429; or `PGRST`,
/// PostgREST's own response (its body in the message, and in DETAIL the status 429 with
/// `Retry-After` and draft 11's `RateLimit` and `RateLimit-Policy`).
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
#[allow(clippy::upper_case_acronyms)]
pub enum ThrowAs {
    RL429,
    PT429,
    PGRST,
}

/// `rate_limiter.throw_as`: any role's, per session, role or database (the caller picks how
/// its own denials read; none admits more).
pub static THROW_AS: GucSetting<ThrowAs> = GucSetting::<ThrowAs>::new(ThrowAs::RL429);

/// The most concurrency-limit slots one transaction may hold at once: each is an entry of the
/// server's shared lock table, sized for about `max_locks_per_transaction` (64) per
/// connection, which every database shares.
pub static MAX_SLOTS_PER_TRANSACTION: GucSetting<i32> = GucSetting::<i32>::new(32);

/// The most keys of memory limits one transaction may look for outside shared memory (each
/// held by a lock in the shared lock table until the transaction ends, while the key may be
/// counted in its row).
pub static MAX_MEMORY_KEY_LOCKS_PER_TRANSACTION: GucSetting<i32> = GucSetting::<i32>::new(32);

/// The longest lease `acquire` and `renew` give, in seconds: a lease's rows stay until it
/// ends (`prune()` removes them then), so this bounds how long a caller's rows stay.
pub static MAX_LEASE: GucSetting<i32> = GucSetting::<i32>::new(86_400);

/// `rate_limiter.prune_interval`, in seconds; 0 turns the worker off.
pub static PRUNE_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(60);

/// `rate_limiter.track_stats`: count calls (when preloaded).
pub static TRACK_STATS: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `rate_limiter.stats_max_names`: (database, name) pairs with an entry of their own.
pub static STATS_MAX_NAMES: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// `rate_limiter.stats_max_names_per_database`: the most of them one database may hold.
pub static STATS_MAX_NAMES_PER_DATABASE: GucSetting<i32> = GucSetting::<i32>::new(250);

/// `rate_limiter.deny_cache_slots`: slots of the deny cache (rounded up to a power of two).
pub static DENY_CACHE_SLOTS: GucSetting<i32> = GucSetting::<i32>::new(16384);

/// `rate_limiter.hot_keys`: how many hot (name, key) pairs can be in use at once.
pub static HOT_KEYS: GucSetting<i32> = GucSetting::<i32>::new(16);

/// `rate_limiter.hot_keys_per_database`: how many of them one database may hold (at least
/// one); -1 for half of them, so that one database cannot take them all.
pub static HOT_KEYS_PER_DATABASE: GucSetting<i32> = GucSetting::<i32>::new(-1);

/// `rate_limiter.memory_keys`: how many (limit, key) pairs of memory limits can be counted
/// at once.
pub static MEMORY_KEYS: GucSetting<i32> = GucSetting::<i32>::new(1_200_000);

/// `rate_limiter.memory_keys_per_database`: how many of them one database may hold; -1 for
/// seven eighths of them.
pub static MEMORY_KEYS_PER_DATABASE: GucSetting<i32> = GucSetting::<i32>::new(-1);

/// `rate_limiter.memory_snapshot`, in milliseconds; 0 turns the snapshots off.
pub static MEMORY_SNAPSHOT: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// From `_PG_init`: every setting a backend may use; those that size shared memory (and
/// the snapshots' interval, with memory limits on) only while the postmaster preloads.
pub fn register(preloading: bool) {
    GucRegistry::define_string_guc(
        c"rate_limiter.fake_now",
        c"Time the rate limiter takes as now (timestamptz text); empty uses the real clock.",
        c"For tests: moves the limiter's clock. Superuser only, so it cannot be used to dodge a limit.",
        &FAKE_NOW,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"rate_limiter.shadow",
        c"Shadow mode for every limit of the session: a call that would be denied is answered ok, taking nothing, with reason 'shadow'.",
        c"Blocks still deny. Counted in rate_limiter.stats.shadow_denied. Superusers, and roles granted SET ON PARAMETER rate_limiter.shadow; SET LOCAL through a transaction pooler.",
        &SHADOW,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"rate_limiter.throw_as",
        c"How a denial that throws is raised: RL429, PT429 (PostgREST answers HTTP 429) or PGRST (PostgREST's response with Retry-After and RateLimit headers).",
        c"For throws => true and write limits. PGRST puts PostgREST's body in the message and {\"status\": 429, \"headers\": {...}} in DETAIL.",
        &THROW_AS,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.max_slots_per_transaction",
        c"The most concurrency-limit slots one transaction may hold at once; a call that would hold more is refused (53400).",
        c"Each slot held is an entry of the server's shared lock table, which every database shares. A superuser setting; keep it well inside max_locks_per_transaction.",
        &MAX_SLOTS_PER_TRANSACTION,
        1,
        MAX_SLOTS as i32,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.max_memory_key_locks_per_transaction",
        c"The most keys of memory limits one transaction may look for outside shared memory; a call for one more is refused (53400).",
        c"Each such key is locked until the transaction ends, an entry of the server's shared lock table, which every database shares. A superuser setting; keep it well inside max_locks_per_transaction.",
        &MAX_MEMORY_KEY_LOCKS_PER_TRANSACTION,
        1,
        MAX_SLOTS as i32,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.max_lease",
        c"The longest lease acquire and renew give; a longer one is refused (22023).",
        c"A lease's rows stay until it ends, when prune() removes them. A superuser setting.",
        &MAX_LEASE,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.prune_interval",
        c"How often the background worker removes expired rows of rate_limiter.state; 0 turns it off.",
        c"Needs shared_preload_libraries = 'rate_limiter'. Each run prunes every database that has the extension.",
        &PRUNE_INTERVAL,
        0,
        i32::MAX / 1000,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_bool_guc(
        c"rate_limiter.track_stats",
        c"Count rate limit calls in rate_limiter.stats and rate_limiter.top_denied.",
        c"Needs shared_preload_libraries = 'rate_limiter'.",
        &TRACK_STATS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.stats_max_names_per_database",
        c"Limit names one database may have counted in rate_limiter.stats under their own rows; more are counted under its *other*.",
        c"So that no database takes the room of rate_limiter.stats_max_names from the others.",
        &STATS_MAX_NAMES_PER_DATABASE,
        1,
        10_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    if !preloading {
        return;
    }
    GucRegistry::define_int_guc(
        c"rate_limiter.stats_max_names",
        c"Limit names counted in rate_limiter.stats each under its own row, over all databases.",
        c"Each name takes about 6 kB of shared memory.",
        &STATS_MAX_NAMES,
        1,
        10_000,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.deny_cache_slots",
        c"Slots of the deny cache (limits with deny_cache); 0 turns it off.",
        c"Rounded up to a power of two; each slot takes 192 bytes of shared memory.",
        &DENY_CACHE_SLOTS,
        0,
        1 << 24,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.hot_keys",
        c"How many (name, key) pairs of hot limits can be in use at once; 0 turns hot limits off.",
        c"Each takes about 140 kB of shared memory.",
        &HOT_KEYS,
        0,
        1 << 16,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.hot_keys_per_database",
        c"How many of the rate_limiter.hot_keys entries one database may hold; -1 for half of them.",
        c"So that one database's open transactions cannot take every entry from the others.",
        &HOT_KEYS_PER_DATABASE,
        -1,
        1 << 16,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.memory_keys",
        c"How many (limit, key) pairs of memory limits (durable => false) can be counted in shared memory at once; 0 turns memory limits off.",
        c"Each takes 117 bytes of shared memory; counted in whole partitions of 64. A key that finds no room is counted in its row of rate_limiter.state until room frees.",
        &MEMORY_KEYS,
        0,
        1 << 30,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"rate_limiter.memory_keys_per_database",
        c"How many of the rate_limiter.memory_keys entries one database may hold; -1 for seven eighths of them.",
        c"So that one database's keys cannot take every entry from the others; its keys beyond it are counted in rows.",
        &MEMORY_KEYS_PER_DATABASE,
        -1,
        1 << 30,
        GucContext::Suset,
        GucFlags::default(),
    );
    if MEMORY_KEYS.get() > 0 {
        GucRegistry::define_int_guc(
            c"rate_limiter.memory_snapshot",
            c"How often memory limits' changed counts are written to rate_limiter.memory_snapshot, which a crash or a promotion loads; 0 turns it off.",
            c"After a crash, a key of a memory limit may admit again at most what it admitted in the last interval (and the worker's round).",
            &MEMORY_SNAPSHOT,
            0,
            3_600_000,
            GucContext::Sighup,
            GucFlags::UNIT_MS,
        );
    }
}
