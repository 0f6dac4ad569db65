//! Hot limits (docs/hot-limits.md): calls admitted against an escrow in shared memory that
//! counts every debit still in flight, each debit logged in a row of its own, settled when
//! its transaction ends (the callbacks below), and folded into the key's base row now and
//! then by a caller. Transactions on one hot key never wait for each other.

use crate::bucket::escrow::{self, Debit};
use crate::bucket::{self, Config, State};
use crate::call::{Decision, Request};
use crate::clock;
use crate::config::LimitRow;
use crate::error::Error;
use crate::overrides;
use crate::shmem::{gate, hot};
use crate::storage::{self, DebitLog, Latest, Owner, Seen, Slot, StateTable};

use super::in_flight::{self, Forget};

fn slot<'a>(req: &Request<'a>) -> Slot<'a> {
    Slot { name: req.name, key: req.key, shard: 0, owner: Owner::Named }
}

/// Consume (`rate_limit` on a hot limit): admitted against the escrow, logged if it takes
/// tokens; every `hot::FOLD_EVERY` commits, the caller also folds the settled log.
pub fn consume(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    // An escrow is built only from what every other transaction sees, whichever way this one
    // ends; this one's own reset or change of the limit is not that (docs/hot-limits.md).
    if changed_here(req.name, req.key) {
        Error::ChangedHere(req.name.to_owned()).raise()
    }
    let mut log = DebitLog::open(Some(c"rate_limit()"));
    let now = clock::now_ms();
    let mut guard = hot::hold(req.name, req.key, config, || load(table, &log, req, config, now)).unwrap_or_else(|e| e.raise());
    let ticket = guard.ticket();
    let entry = guard.entry();
    let admitted = entry.escrow().admit(config, now, req.count, req.reserve, hot::next_seq());
    let fold_below = (admitted.seq.is_some() && entry.start_fold())
        .then(|| entry.escrow().unsettled_from());
    // Noted before anything can fail, so that the transaction's end settles both.
    if let Some(seq) = admitted.seq {
        in_flight::note_debit(in_flight::Debit::Hot(ticket, seq));
    }
    if fold_below.is_some() {
        in_flight::note_folding(ticket);
    }
    drop(guard);
    if let Some(seq) = admitted.seq {
        log.insert(req.name, req.key, &Debit { seq, at: admitted.outcome.at, count: req.count, committed: false });
    }
    if let Some(below) = fold_below {
        fold(&log, req.name, Some(req.key), &|_| Some(*config), below, c"rate_limit()");
    }
    admitted.outcome.decision(req.name)
}

/// `check_rate_limit` on a hot limit: against the escrow (calls in flight count) when it is
/// loaded here, else against the committed state the call's snapshot sees.
pub fn check(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    let (state, at) = current(table, req, config, clock::now_ms());
    let outcome = bucket::plan(&[state], config, at, req.count, req.reserve);
    outcome.decision(req.name)
}

/// The state `rate_limit_value` reports for a hot limit (see `check`).
pub fn value(table: &StateTable, req: &Request<'_>, config: &Config) -> State {
    current(table, req, config, clock::now_ms()).0
}

/// The state calls are decided against, and the instant they are decided at.
fn current(table: &StateTable, req: &Request<'_>, config: &Config, now: f64) -> (State, f64) {
    // After this transaction's own reset or change of the limit, its tables say more than the
    // escrow (which changes at commit).
    let escrow = if changed_here(req.name, req.key) { None } else { hot::peek(req.name, req.key) };
    if let Some(mut guard) = escrow {
        let entry = guard.entry();
        if entry.config() == config {
            let escrow = entry.escrow();
            return (escrow.tail(), escrow.admission_instant(now));
        }
    }
    // Not loaded here (a standby, a subscriber, a server just started): the base row and the
    // committed log, with this transaction's own changes.
    let (state, last, _) = committed(table, &DebitLog::open(None), req, config, now);
    (state, now.max(last))
}

/// The committed state of a key (base row and log, as committed now), its latest debit's
/// instant, and how many debits its log holds: what an escrow starts from. Also raises the
/// debit numbers above the log's. Called with no lock held: nothing can be logged for a key
/// whose escrow is not loaded, and no fold of it can be in flight (a fold is started from a
/// loaded escrow, which is not given away while it folds).
fn load(table: &StateTable, log: &DebitLog, req: &Request<'_>, config: &Config, now: f64) -> (State, f64, u64) {
    hot::numbers_above(log.last_seq());
    committed(table, log, req, config, now)
}

/// The key's base row and log as the latest snapshot sees them (every commit by now, and this
/// transaction's own writes), whatever the isolation level: a fold may have rewritten the
/// base row after the transaction's snapshot, which would then see the old and the new row.
/// One snapshot for both: a fold committed between two reads would be counted in neither.
fn committed(table: &StateTable, log: &DebitLog, req: &Request<'_>, config: &Config, now: f64) -> (State, f64, u64) {
    let latest = Latest::take();
    replay(req, config, table.read_at(slot(req), &latest).map(|r| r.state), log, Seen::At(latest.snapshot()), now)
}

/// `base` with the key's logged debits applied in order (a missing base starts fresh at the
/// first debit's instant, or now), the latest instant among them, and how many there were.
fn replay(req: &Request<'_>, config: &Config, base: Option<State>, log: &DebitLog, seen: Seen, now: f64) -> (State, f64, u64) {
    let (mut state, mut last, mut debits) = (base, f64::NEG_INFINITY, 0);
    log.each(req.name, Some(req.key), None, seen, |_, debit, _| {
        let base = state.take().unwrap_or_else(|| bucket::fresh(config, req.name, req.key, debit.at.min(now)));
        state = Some(escrow::apply(&base, config, debit));
        last = last.max(debit.at);
        debits += 1;
    });
    (state.unwrap_or_else(|| bucket::fresh(config, req.name, req.key, now)), last, debits)
}

/// Move the logged debits of `name` (of `key` only, when given) numbered below `below` (all
/// when `None`) into their keys' base rows, and delete them: in the caller's transaction, so
/// that the base and the log change together, with the newest committed rows at every
/// isolation level (a fold leaves their sum as it was). Each key's debits are applied under
/// the config they were admitted under, `config_of(key)` (its override's or the limit's); a
/// key it gives none for keeps its debits. One key at a time, as the log's index orders them;
/// nothing kept but the key being folded.
fn fold(
    log: &DebitLog,
    name: &str,
    key: Option<Option<&str>>,
    config_of: &dyn Fn(Option<&str>) -> Option<Config>,
    below: Option<u64>,
    command: &std::ffi::CStr,
) {
    let table = &StateTable::open_newest(command);
    /// A key being folded: its config, locked base row and state so far; None for a key
    /// whose debits stay.
    struct Folding {
        key: Option<String>,
        into: Option<(Config, storage::Row, State)>,
    }
    let write = |f: Folding| {
        if let Some((config, row, state)) = f.into {
            let req = Request { name, key: f.key.as_deref(), count: 0.0, reserve: false, inline: None, exempt: false };
            let expires = bucket::expires(&state, &config);
            table.write_locked(&row, slot(&req), &state, expires);
        }
    };
    let mut folding: Option<Folding> = None;
    log.each(name, key, below, Seen::Now, |row_key, debit, row| {
        if folding.as_ref().is_none_or(|f| f.key.as_deref() != row_key) {
            if let Some(done) = folding.take() {
                write(done);
            }
            let into = config_of(row_key).map(|config| {
                let req = Request { name, key: row_key, count: 0.0, reserve: false, inline: None, exempt: false };
                // A missing base row starts fresh at the first debit's instant.
                let starting = || {
                    let fresh = bucket::fresh(&config, name, row_key, debit.at);
                    (fresh.clone(), bucket::expires(&fresh, &config))
                };
                let locked = super::rows::lock_one(table, slot(&req), table.read(slot(&req)), true, &starting).expect("waited for the row");
                let state = locked.state.clone();
                (config, locked, state)
            });
            folding = Some(Folding { key: row_key.map(str::to_owned), into });
        }
        if let Some((config, _, state)) = &mut folding.as_mut().expect("set above").into {
            *state = escrow::apply(state, config, debit);
            log.delete(row);
        }
    });
    if let Some(done) = folding {
        write(done);
    }
    log.deleted();
}

/// `reset_rate_limit` of a hot limit's key: once no call is in flight, its log goes (the
/// caller deletes the base row), and its escrow when this transaction commits.
pub fn reset(name: &str, key: Option<&str>) {
    gate::hold_calls_off();
    let log = DebitLog::open(Some(c"reset_rate_limit()"));
    log.each(name, Some(key), None, Seen::Now, |_, _, row| log.delete(row));
    log.deleted();
    in_flight::forget_at_commit(Forget::Key(name.to_owned(), key.map(str::to_owned)));
}

/// Where a change of a limit comes from.
#[derive(Clone, Copy, PartialEq)]
pub enum Change {
    /// This database's own (a session, or an apply worker of a subscription that does not
    /// carry the log): it waits for the calls in flight and folds.
    Local,
    /// A publisher's, whose fold (or refusal) happened there and arrives as its own changes.
    Replicated,
}

/// A change of a limit that is or was hot (`rate_limiter.limits`' trigger): once no call is
/// in flight, a limit that was hot (`was`, its row) has its whole log folded into base rows,
/// each key's under the config it had (its override's numbers applied to `was`), and its
/// escrows go when this transaction commits; calls after it load the new one.
pub fn limit_changing(name: &str, was: Option<&LimitRow>, change: Change) {
    in_flight::forget_at_commit(Forget::Name(name.to_owned()));
    if change == Change::Replicated {
        return;
    }
    gate::hold_calls_off();
    if let Some(row) = was {
        let log = DebitLog::open(Some(c"define()"));
        fold(&log, name, None, &|key| overrides::config_under(row, name, key).ok(), None, c"define()");
    }
}

/// A change of the numbers of some keys of the hot limit `name` (an override or a tier): once
/// no call is in flight, each key's log is folded under `was`, the config its debits were
/// admitted under, and its escrow goes when this transaction commits.
pub fn keys_changing(name: &str, was: &[(Option<String>, Config)], change: Change) {
    for (key, _) in was {
        in_flight::forget_at_commit(Forget::Key(name.to_owned(), key.clone()));
    }
    if change == Change::Replicated || was.is_empty() {
        return;
    }
    gate::hold_calls_off();
    let log = DebitLog::open(Some(c"override()"));
    for (key, config) in was {
        fold(&log, name, Some(key.as_deref()), &|_| Some(*config), None, c"override()");
    }
}

/// Whether the log holds a debit of `name`, committed or not.
pub fn logged(name: &str) -> bool {
    DebitLog::open(None).holds(name)
}

/// `TRUNCATE rate_limiter.limits`: refused while a log holds debits not yet folded (their
/// configs are gone, and a limit defined again would forget them); else every escrow of the
/// database goes at commit.
pub fn limits_truncated(change: Change) {
    if change == Change::Replicated {
        in_flight::forget_at_commit(Forget::Database);
        return;
    }
    gate::hold_calls_off();
    if DebitLog::open(None).last_seq() != 0 {
        Error::NotSupported(
            "TRUNCATE rate_limiter.limits while hot limits have debits not yet folded: DELETE them instead, which folds"
                .into(),
        )
        .raise()
    }
    in_flight::forget_at_commit(Forget::Database);
}

/// Whether this transaction (in a subtransaction not rolled back) reset `key` of `name`,
/// changed `name`, or truncated the limits.
fn changed_here(name: &str, key: Option<&str>) -> bool {
    in_flight::forgotten_here(|what| match what {
        Forget::Key(n, k) => n == name && k.as_deref() == key,
        Forget::Name(n) => n == name,
        Forget::Database => true,
        Forget::MemoryKey(_) | Forget::MemoryLimit(_) | Forget::MemoryChanged(..) => false,
    })
}
