//! Memory limits (`durable => false`, docs/memory-limits.md): calls admitted against an
//! escrow in shared memory that counts every call still in flight, as a hot limit's does,
//! with no row, no log and no WAL. A call takes tokens at once; its transaction's commit
//! keeps them, and an abort (or a rolled-back savepoint) gives them back (`in_flight`).
//!
//! A key that finds no room in shared memory is counted in its row of `rate_limiter.state`
//! instead, exactly as a durable limit's, until its row equals an absent key's and room
//! frees (`place`): never refused for want of room, never admitted twice.

use crate::bucket::escrow::Planned;
use crate::bucket::{self, Config, State};
use crate::cache;
use crate::call::{Decision, Reason, Request};
use crate::clock;
use crate::config;
use crate::error::Error;
use crate::shmem::memory::{self, snapshot, Claim, Hold, Identity, Listed, Rows as RowsMay};
use crate::shmem::{gate, stats};
use crate::storage::snapshot::Rows;
use crate::storage::{self, Latest, StateTable};
use super::in_flight::{self, Forget};
use super::rows;

/// The entry of a call's (limit, key): the extension's incarnation is the state table's
/// OID, which a DROP and CREATE EXTENSION changes.
fn identity(req: &Request<'_>) -> Identity {
    memory::identity(cache::relations().state, req.name, req.key, req.inline.as_ref())
        .unwrap_or_else(|| Error::MemoryUnavailable.raise())
}

/// Whether this transaction reset the key, or changed or deleted the limit, or truncated
/// the limits (`kept`: but for a change that keeps the counts): its escrow changes only at
/// commit, so this transaction's calls would be decided against what its own rollback could
/// not take back.
fn changed_here(id: &Identity, kept: bool) -> bool {
    in_flight::forgotten_here(|what| match what {
        Forget::MemoryKey(key) => key.same_key(id),
        Forget::MemoryLimit(limit) => *limit == id.limit_tag(),
        Forget::MemoryChanged(limit, _) => kept && *limit == id.limit_tag(),
        Forget::Database => true,
        Forget::Key(..) | Forget::Name(_) => false,
    })
}

/// `rate_limit` on a memory limit: admitted against the escrow, the debit settled when the
/// (sub)transaction ends.
pub fn consume(req: &Request<'_>, config: &Config) -> Decision {
    list(req, config, Listing::Take, true)
}

/// `consume` as a part of `rate_limit_all`, which may have to take it back: refused (0A000)
/// where the key's ring is full of this transaction's own calls, whose fold could not be.
pub fn consume_to_take_back(req: &Request<'_>, config: &Config) -> Decision {
    list(req, config, Listing::Take, false)
}

/// `credit` on a memory limit: listed in the escrow, counted by other calls only once its
/// (sub)transaction commits (a rollback takes it back, as a durable credit's does).
pub fn credit(req: &Request<'_>, config: &Config) -> Decision {
    list(req, config, Listing::Credit, true)
}

/// The fingerprint of a named limit's config as an entry keeps it: the last one computed
/// is kept, as a backend calls the same limit again and again (equal configs have equal
/// fingerprints).
fn fingerprint(config: &Config) -> u64 {
    thread_local! {
        static LAST: std::cell::Cell<Option<(Config, u64)>> = const { std::cell::Cell::new(None) };
    }
    match LAST.get() {
        Some((last, fingerprint)) if last == *config => fingerprint,
        _ => {
            let fingerprint = memory::config_tag(&config::fingerprint(config));
            LAST.set(Some((*config, fingerprint)));
            fingerprint
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Listing {
    Take,
    Credit,
}

/// Where a key is counted.
enum Place {
    Entry(memory::Guard),
    /// In its row of `rate_limiter.state`, as a durable limit's key.
    Row,
}

/// Whether this database's memory limits may have counted keys in rows (a standby counts
/// its own calls, in memory alone): after a restart, the snapshot table's mark tells.
fn rows_may_exist() -> bool {
    if storage::in_recovery() {
        return false;
    }
    if memory::rows_may_exist() == RowsMay::Unknown {
        memory::rows_looked_up(memory::snapshot_origin().is_some_and(storage::snapshot::rows_marked));
    }
    memory::rows_may_exist() != RowsMay::None
}

/// Whether (name, key)'s row counts anything at `now`: a row that equals an absent key's
/// counts nothing, and the key may move into shared memory. Read with the latest snapshot,
/// which the key's lock (held) makes final: a row a call created, committed or not, is
/// seen here once that call's transaction ended.
fn row_counts(req: &Request<'_>, config: &Config, now: f64) -> bool {
    let table = StateTable::open(None);
    let latest = Latest::take();
    table.read_at(rows::slot(req, 0), &latest).is_some_and(|row| bucket::expires(&row.state, config) > now)
}

/// Where `id`'s key is counted: its entry, found or given; else, one call at a time (the
/// key's lock, held to the transaction's end), its row, if that counts anything or there
/// is no room in shared memory. A standby has no rows to write: a key there that finds no
/// room is refused (53400).
fn place(id: &Identity, req: &Request<'_>, config: &Config, fingerprint: u64, now: f64) -> Place {
    let fresh = || bucket::fresh(config, req.name, req.key, now);
    let hold = |claim: Claim| memory::hold(id, req.name, fingerprint, now, claim, fresh).unwrap_or_else(|e| e.raise());
    let standby = storage::in_recovery();
    match hold(if standby { Claim::Always } else { Claim::UnlessRowsMayExist }) {
        Hold::Entry(guard) => return Place::Entry(guard),
        Hold::NoRoom if standby => refused(req, Error::MemoryKeysFull { share: None }),
        Hold::Absent | Hold::NoRoom => {}
    }
    let taken = storage::lock_memory_key(&id.key_bytes());
    let place = match hold(Claim::Never) {
        Hold::Entry(guard) => Place::Entry(guard),
        _ if rows_may_exist() && row_counts(req, config, now) => Place::Row,
        _ => match hold(Claim::Always) {
            Hold::Entry(guard) => Place::Entry(guard),
            Hold::Absent | Hold::NoRoom => Place::Row,
        },
    };
    // A key in shared memory is found there by every later call, which takes no lock: only
    // a key counted in its row (written, not yet committed) keeps its lock to the end, so a
    // transaction holds one lock for each such key alone.
    if let Place::Entry(_) = place {
        storage::release_memory_key(&id.key_bytes(), taken);
    }
    place
}

/// A call of a key counted in its row: the durable limit's, in this call's own open of the
/// table for writing.
fn in_row(req: &Request<'_>, config: &Config, what: Listing) -> Decision {
    let command = if what == Listing::Credit { c"credit()" } else { c"rate_limit()" };
    let table = StateTable::open(Some(command));
    note_in_row(req);
    match what {
        Listing::Take => rows::consume(&table, req, config),
        Listing::Credit => rows::credit(&table, req, config),
    }
}

/// A call counted in its key's row: the snapshot table's mark says so after a restart, and
/// the statistics count it.
fn note_in_row(req: &Request<'_>) {
    if let Some(origin) = memory::snapshot_origin() {
        storage::snapshot::mark_rows(origin);
    }
    stats::record_overflow(req.name);
}

/// The config's fingerprint as an entry keeps it: an inline config's is its request's
/// already.
fn fingerprint_of(req: &Request<'_>, config: &Config) -> u64 {
    req.inline.as_ref().map_or_else(|| fingerprint(config), memory::config_tag)
}

/// For `rate_limit_all`, before its parts are decided: whether a memory part's key is
/// counted in its row (the part is then decided as a durable one); else its entry is kept
/// for it (`pin`) until `unpin`.
pub fn counted_in_row(req: &Request<'_>, config: &Config) -> bool {
    load_snapshot();
    let id = identity(req);
    match place(&id, req, config, fingerprint_of(req, config), clock::now_ms()) {
        Place::Entry(mut guard) => {
            guard.pin();
            in_flight::note_pinned(id, *config);
            false
        }
        Place::Row => {
            note_in_row(req);
            true
        }
    }
}


fn list(req: &Request<'_>, config: &Config, what: Listing, may_fold: bool) -> Decision {
    load_snapshot();
    let id = identity(req);
    if changed_here(&id, true) {
        Error::ChangedHere(req.name.to_owned()).raise()
    }
    let fingerprint = fingerprint_of(req, config);
    let me = storage::my_transaction();
    let mut waited = None;
    loop {
        let now = clock::now_ms();
        let mut guard = match place(&id, req, config, fingerprint, now) {
            Place::Entry(guard) => guard,
            Place::Row => return in_row(req, config, what),
        };
        let ticket = guard.ticket();
        let at = guard.admission_instant(now);
        let tail = guard.tail();
        // As the escrow would answer a call it does not list (see `Escrow::admit`, `credit`):
        // a denial, a count of 0 or a credit that gives nothing back lends no escrow.
        let planned = match what {
            Listing::Take => bucket::plan(std::slice::from_ref(&tail), config, at, req.count, req.reserve),
            Listing::Credit => bucket::plan_credit(std::slice::from_ref(&tail), config, at, req.count),
        };
        let would_list = match what {
            Listing::Take => req.count > 0.0 && planned.ok,
            Listing::Credit => planned.granted < 0.0,
        };
        if !would_list {
            // A key just given its entry has no expiry yet.
            guard.settled(config);
            return planned.decision(req.name);
        }
        let full = guard.full();
        if let Some(holder) = oldest_to_wait_for(&mut guard, full, me).filter(|h| Some(*h) != waited) {
            // As a durable call waits for the row: the ring is full, and a call that would
            // list its debit waits for the transaction of the oldest debit in flight (not
            // its own) rather than fold it into the base, where its rollback would give
            // nothing back.
            drop(guard);
            storage::wait_for_transaction(holder);
            waited = Some(holder);
            continue;
        }
        if full {
            if !may_fold {
                drop(guard);
                Error::NotSupported(format!(
                    "rate_limit_all with the memory limit \"{}\" while this transaction has {} calls of the key in flight",
                    req.name,
                    memory::RING
                ))
                .raise()
            }
            // Every debit in flight is this transaction's, or its holder was waited for
            // already: the older half is folded, counted for good.
            guard.note_committed();
        }
        let count = if what == Listing::Credit { -req.count } else { req.count };
        // The take's plan is the admission's, while the tail and instant are those it was made on.
        let planned = (what == Listing::Take).then_some(Planned { tail, at, outcome: planned });
        let (listed, seq) = guard.list(config, now, count, req.reserve, planned);
        let admitted = match listed {
            Listed::InFlight(admitted) => {
                if let Some(f) = guard.in_flight() {
                    if full {
                        // The older half was folded: its holders are no longer waited for.
                        f.forget_holders_of_settled();
                    }
                    if admitted.seq.is_some() {
                        f.note_holder(seq, me);
                    }
                }
                if admitted.seq.is_some() {
                    in_flight::note_debit(in_flight::Debit::Memory(ticket, seq, *config));
                }
                admitted
            }
            Listed::Settled(admitted) => admitted,
        };
        guard.settled(config);
        drop(guard);
        return admitted.outcome.decision(req.name);
    }
}

/// Raise `error`; a key refused for want of an entry (53400) is counted as denied in the
/// statistics first, and named in the top denied keys, so that a flood of new keys shows.
fn refused(req: &Request<'_>, error: Error) -> ! {
    if matches!(error, Error::MemoryKeysFull { .. }) {
        let denied = Decision {
            ok: false,
            retry_after: None,
            remaining: 0.0,
            reset_after: 0.0,
            granted: 0.0,
            reason: Some(Reason::Exhausted),
            limited_by: Some(req.name.to_owned()),
        };
        stats::record(req.name, req.key, &denied, true);
    }
    error.raise()
}

/// When the entry's ring is `full` for this call: the transaction holding the oldest debit
/// in flight that is not `me`'s, which the call waits for.
fn oldest_to_wait_for(guard: &mut memory::Guard, full: bool, me: (i32, u32)) -> Option<(i32, u32)> {
    if !full {
        return None;
    }
    let f = guard.in_flight()?;
    let seqs: Vec<u64> = f.escrow_ref().in_flight().collect();
    seqs.into_iter().filter_map(|seq| f.holder_of(seq)).find(|h| *h != me)
}

/// The state calls of a key are decided against and the instant they are decided at: the
/// escrow's, calls in flight included, or a fresh one for a key not counted, or that this
/// transaction reset (as a durable limit's reads see its own reset); None when the key may
/// be counted in its row (`place`).
fn current(req: &Request<'_>, config: &Config, now: f64) -> Option<(State, f64)> {
    load_snapshot();
    let id = identity(req);
    if changed_here(&id, false) {
        return Some((bucket::fresh(config, req.name, req.key, now), now));
    }
    if let Some(mut guard) = memory::peek(&id) {
        if !guard.entry_ref().absent() {
            return Some((guard.tail(), guard.admission_instant(now)));
        }
    } else if rows_may_exist() {
        return None;
    }
    Some((bucket::fresh(config, req.name, req.key, now), now))
}

/// `check_rate_limit` on a memory limit.
pub fn check(req: &Request<'_>, config: &Config) -> Decision {
    match current(req, config, clock::now_ms()) {
        Some((state, at)) => bucket::plan(&[state], config, at, req.count, req.reserve).decision(req.name),
        None => rows::check(&StateTable::open(None), req, config),
    }
}

/// The state `rate_limit_value` reports for a memory limit.
pub fn value(req: &Request<'_>, config: &Config) -> State {
    match current(req, config, clock::now_ms()) {
        Some((state, _)) => state,
        None => rows::value(&StateTable::open(None), req, config, 1).0,
    }
}

/// `reset_rate_limit` of (name, key), under its named limit and every inline config: once
/// no call is in flight (a reset of a key this server counts in memory waits for every
/// call, and keeps new ones out until it commits, as a hot limit's does), its counts go
/// when this transaction commits.
pub fn reset(name: &str, key: Option<&str>) {
    load_snapshot();
    // Without memory limits on, no key is counted.
    let Some(id) = memory::identity(cache::relations().state, name, key, None) else { return };
    // A key not counted in memory has no records in the log that count anything (an entry
    // goes only once its counts equal an absent key's, or with a forget of its own), so
    // only a counted key's reset is logged: a reset of a durable key writes nothing there.
    if memory::counts_key(&id) {
        forget(Rows::Key(id.key_bytes()));
        gate::hold_calls_off();
        in_flight::forget_at_commit(Forget::MemoryKey(id));
    }
}

/// Log a forget of `rows` in the snapshot, in this transaction.
fn forget(rows: Rows) {
    if let Some(origin) = memory::snapshot_origin() {
        storage::snapshot::forget(origin, rows);
    }
}

/// A memory limit changing (the triggers of `rate_limiter.limits`, overrides and tiers): it
/// waits for the calls in flight, and at commit its keys' counts are taken on under the
/// configs its keys may now be decided under (`configs`, asked once no other change of it can
/// commit meanwhile: the limit's, its overrides' and tiers'; none known, none of its keys is
/// given away until called again), as a durable limit's rows are.
pub fn limit_changing(name: &str, configs: impl FnOnce() -> Option<Vec<Config>>) {
    let Some(limit) = limit_held_still(name) else { return };
    in_flight::forget_at_commit(Forget::MemoryChanged(limit, configs().unwrap_or_default()));
}

/// A memory limit deleted or renamed: it waits for the calls in flight, and its counts go at
/// commit.
pub fn limit_going(name: &str) {
    let Some(limit) = limit_held_still(name) else { return };
    forget(Rows::Limit(limit));
    in_flight::forget_at_commit(Forget::MemoryLimit(limit));
}

/// The tag of memory limit `name`, once its calls in flight ended and new ones wait for this
/// transaction; None without memory limits.
fn limit_held_still(name: &str) -> Option<u64> {
    load_snapshot();
    gate::hold_calls_off();
    memory::limit_tag(cache::relations().state, name)
}

/// After a crash or a promotion, this database's counts as the worker last wrote them,
/// before anything reads or changes them: loaded by the first session to need them, while
/// the others wait (once per loss).
fn load_snapshot() {
    if !snapshot::needs_load() {
        return;
    }
    let _one_at_a_time = storage::snapshot::LoadLock::take();
    if !snapshot::needs_load() {
        return;
    }
    let Some(origin) = memory::snapshot_origin() else { return };
    // A key the primary counted in its row (for want of room) takes that row's count over a
    // promoted standby's own: before the database is marked loaded (`restore`).
    if storage::snapshot::rows_marked(origin) {
        for (name, key) in storage::snapshot::keys_in_rows() {
            if let Some(id) = memory::identity(cache::relations().state, &name, key.as_deref(), None) {
                memory::give_way(&id);
            }
        }
    }
    let log = storage::snapshot::read(origin);
    match snapshot::restore(&log, clock::now_ms()) {
        Ok(loaded) => pgrx::log!(
            "rate_limiter: {} memory limit keys loaded from rate_limiter.memory_snapshot, {} without room{}",
            loaded.restored,
            loaded.dropped,
            if loaded.unreadable > 0 { format!(", {} rows of another format skipped", loaded.unreadable) } else { String::new() }
        ),
        Err(e) => e.raise(),
    }
}

/// `TRUNCATE rate_limiter.limits` (not replicated: a subscriber's snapshot is its own): the
/// snapshot's rows go with the counts.
pub fn limits_truncated() {
    forget(Rows::All);
}
