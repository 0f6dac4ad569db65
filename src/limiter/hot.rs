//! Hot limits (docs/hot-limits.md): calls admitted against an escrow in shared memory that
//! counts every debit still in flight, each debit logged in a row of its own, settled when
//! its transaction ends (the callbacks below), and folded into the key's base row now and
//! then by a caller. Transactions on one hot key never wait for each other.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::bucket::escrow::{self, Debit};
use crate::bucket::{self, Config, State};
use crate::call::{Decision, Request};
use crate::clock;
use crate::error::Error;
use crate::shmem::hot::{self, Ticket};
use crate::storage::{self, DebitLog, Latest, Owner, Seen, Slot, StateTable};

/// Commits between two folds of a key's log into its base row.
const FOLD_EVERY: u64 = 1000;

/// What this backend's open transaction did to hot limits, for its end.
#[derive(Default)]
struct Open {
    /// Debits in flight: where, which number, and in which subtransaction.
    debits: Vec<(Ticket, u64, pg_sys::SubTransactionId)>,
    /// Escrows to drop at commit, and the subtransaction that asked.
    forget: Vec<(Forget, pg_sys::SubTransactionId)>,
    /// The escrows whose logs this transaction folds, and in which subtransaction.
    folding: Vec<(Ticket, pg_sys::SubTransactionId)>,
}

/// Which escrows a commit drops.
enum Forget {
    Key(String, Option<String>),
    Name(String),
    Database,
}

thread_local! {
    static OPEN: RefCell<Open> = RefCell::new(Open::default());
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

fn subtransaction() -> pg_sys::SubTransactionId {
    // SAFETY: reads this backend's transaction state, inside a transaction.
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}

fn register_callbacks() {
    if !REGISTERED.get() {
        // SAFETY: both callbacks live as long as the library; registered once per backend.
        unsafe {
            pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
        }
        REGISTERED.set(true);
    }
}

fn slot<'a>(req: &Request<'a>) -> Slot<'a> {
    Slot { name: req.name, key: req.key, shard: 0, owner: Owner::Named }
}

/// Consume (`rate_limit` on a hot limit): admitted against the escrow, logged if it takes
/// tokens; every `FOLD_EVERY` commits, the caller also folds the settled log.
pub fn consume(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    // An escrow is built only from what every other transaction sees, whichever way this one
    // ends; this one's own reset or change of the limit is not that (docs/hot-limits.md).
    if changed_here(req.name, req.key) {
        Error::HotChangedHere(req.name.to_owned()).raise()
    }
    let mut log = DebitLog::open(Some(c"rate_limit()"));
    register_callbacks();
    let now = clock::now_ms();
    let mut guard = hot::hold(req.name, req.key, config, || load(table, &log, req, config, now)).unwrap_or_else(|e| e.raise());
    let ticket = guard.ticket();
    let entry = guard.entry();
    let admitted = entry.escrow().admit(config, now, req.count, req.reserve, hot::next_seq());
    let fold_below = (admitted.seq.is_some() && entry.start_fold(FOLD_EVERY))
        .then(|| entry.escrow().unsettled_from());
    // Noted before anything can fail, so that the transaction's end settles both.
    OPEN.with_borrow_mut(|open| {
        if let Some(seq) = admitted.seq {
            open.debits.push((ticket, seq, subtransaction()));
        }
        if fold_below.is_some() {
            open.folding.push((ticket, subtransaction()));
        }
    });
    drop(guard);
    if let Some(seq) = admitted.seq {
        log.insert(req.name, req.key, &Debit { seq, at: admitted.at, count: req.count, committed: false });
    }
    if let Some(below) = fold_below {
        fold(&log, req.name, Some(req.key), config, below, c"rate_limit()");
    }
    super::decision(req, &admitted.outcome, config, config, admitted.at)
}

/// `check_rate_limit` on a hot limit: against the escrow (calls in flight count) when it is
/// loaded here, else against the committed state the call's snapshot sees.
pub fn check(table: &StateTable, req: &Request<'_>, config: &Config) -> Decision {
    let (state, at) = current(table, req, config, clock::now_ms());
    let outcome = bucket::plan(&[state], config, at, req.count, req.reserve);
    super::decision(req, &outcome, config, config, at)
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
        let base = state.unwrap_or_else(|| super::fresh(req, config, debit.at.min(now)));
        state = Some(escrow::apply(base, config, debit));
        last = last.max(debit.at);
        debits += 1;
    });
    (state.unwrap_or_else(|| super::fresh(req, config, now)), last, debits)
}

/// Move the logged debits of `name` (of `key` only, when given) numbered below `below` (all
/// when `None`) into their keys' base rows, and delete them: in the caller's transaction, so
/// that the base and the log change together, with the newest committed rows at every
/// isolation level (a fold leaves their sum as it was). One key at a time, as the log's index
/// orders them; nothing kept but the key being folded.
fn fold(log: &DebitLog, name: &str, key: Option<Option<&str>>, config: &Config, below: Option<u64>, command: &std::ffi::CStr) {
    let table = &StateTable::open_newest(command);
    struct Folding {
        key: Option<String>,
        row: storage::Row,
        state: State,
    }
    let write = |f: Folding| {
        let req = Request { name, key: f.key.as_deref(), count: 0.0, reserve: false, inline: None };
        table.write_locked(&f.row, slot(&req), f.state, bucket::expires(f.state, config));
    };
    let mut folding: Option<Folding> = None;
    log.each(name, key, below, Seen::Now, |row_key, debit, row| {
        if folding.as_ref().is_none_or(|f| f.key.as_deref() != row_key) {
            if let Some(done) = folding.take() {
                write(done);
            }
            let req = Request { name, key: row_key, count: 0.0, reserve: false, inline: None };
            let first = debit.at;
            let row = super::lock_one(table, &req, config, slot(&req), table.read(slot(&req)), true, &|| first)
                .expect("waited for the row");
            folding = Some(Folding { key: row_key.map(str::to_owned), state: row.state, row });
        }
        let f = folding.as_mut().expect("set above");
        f.state = escrow::apply(f.state, config, debit);
        log.delete(row);
    });
    if let Some(done) = folding {
        write(done);
    }
    log.deleted();
}

/// `reset_rate_limit` of a hot limit's key: once no call is in flight, its log goes (the
/// caller deletes the base row), and its escrow when this transaction commits.
pub fn reset(name: &str, key: Option<&str>) {
    storage::hold_calls_off();
    register_callbacks();
    let log = DebitLog::open(Some(c"reset_rate_limit()"));
    log.each(name, Some(key), None, Seen::Now, |_, _, row| log.delete(row));
    log.deleted();
    forget_at_commit(Forget::Key(name.to_owned(), key.map(str::to_owned)));
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
/// in flight, a limit that was hot (`was`, its config) has its whole log folded into base
/// rows, and its escrows go when this transaction commits; calls after it load the new one.
pub fn limit_changing(name: &str, was: Option<&Config>, change: Change) {
    register_callbacks();
    forget_at_commit(Forget::Name(name.to_owned()));
    if change == Change::Replicated {
        return;
    }
    storage::hold_calls_off();
    if let Some(config) = was {
        let log = DebitLog::open(Some(c"define()"));
        fold(&log, name, None, config, None, c"define()");
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
    register_callbacks();
    if change == Change::Replicated {
        forget_at_commit(Forget::Database);
        return;
    }
    storage::hold_calls_off();
    if DebitLog::open(None).last_seq() != 0 {
        Error::NotSupported(
            "TRUNCATE rate_limiter.limits while hot limits have debits not yet folded: DELETE them instead, which folds"
                .into(),
        )
        .raise()
    }
    forget_at_commit(Forget::Database);
}

/// Whether this transaction (in a subtransaction not rolled back) reset `key` of `name`,
/// changed `name`, or truncated the limits.
fn changed_here(name: &str, key: Option<&str>) -> bool {
    OPEN.with_borrow(|open| {
        open.forget.iter().any(|(what, _)| match what {
            Forget::Key(n, k) => n == name && k.as_deref() == key,
            Forget::Name(n) => n == name,
            Forget::Database => true,
        })
    })
}

fn forget_at_commit(what: Forget) {
    OPEN.with_borrow_mut(|open| open.forget.push((what, subtransaction())));
}

/// The folds of these escrows ended, done or undone.
fn end_folds(folding: Vec<(Ticket, pg_sys::SubTransactionId)>, folded: bool) {
    for mut guard in folding.into_iter().filter_map(|(ticket, _)| hot::redeem(ticket)) {
        guard.entry().end_fold(folded, FOLD_EVERY);
    }
}

/// Settle this backend's debits: committed, or taken back.
fn settle(debits: Vec<(Ticket, u64, pg_sys::SubTransactionId)>, committed: bool) {
    for (ticket, seq, _) in debits {
        // Gone only when this transaction itself reset or redefined the limit after the call.
        if let Some(mut guard) = hot::redeem(ticket) {
            let entry = guard.entry();
            let config = *entry.config();
            if committed {
                if entry.escrow().commit(&config, seq) {
                    entry.note_committed();
                }
            } else {
                entry.escrow().abort(&config, seq);
            }
        }
    }
}

/// # Safety
/// Only as a transaction callback, registered by `register_callbacks`.
#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_PREPARE => {
            // COMMIT PREPARED runs in another backend, whose callbacks know nothing of these.
            let open = OPEN.with_borrow(|o| !o.debits.is_empty() || !o.forget.is_empty() || !o.folding.is_empty());
            if open {
                Error::HotPrepared.raise()
            }
        }
        // After the commit is durable and visible, before the locks are released: so a
        // change that waited for calls drops escrows before the next call can load one.
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT => {
            let open = OPEN.take();
            let committed = event == XACT_EVENT_COMMIT;
            settle(open.debits, committed);
            end_folds(open.folding, committed);
            if committed {
                for (what, _) in open.forget {
                    match what {
                        Forget::Key(name, key) => hot::forget(Some(&name), Some(key.as_deref())),
                        Forget::Name(name) => hot::forget(Some(&name), None),
                        Forget::Database => hot::forget(None, None),
                    }
                }
            }
        }
        _ => {}
    }
}

/// # Safety
/// Only as a subtransaction callback, registered by `register_callbacks`.
#[pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    ending: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    use pg_sys::SubXactEvent::*;
    // Subtransactions still open when `ending` ends are nested in it: numbered after it.
    let inside = |sub: pg_sys::SubTransactionId| sub >= ending;
    match event {
        SUBXACT_EVENT_ABORT_SUB => {
            let (aborted, unfolded) = OPEN.with_borrow_mut(|open| {
                open.forget.retain(|(_, sub)| !inside(*sub));
                let (unfolded, folding) = std::mem::take(&mut open.folding).into_iter().partition(|(_, sub)| inside(*sub));
                open.folding = folding;
                let (aborted, kept) = std::mem::take(&mut open.debits).into_iter().partition(|(_, _, sub)| inside(*sub));
                open.debits = kept;
                (aborted, unfolded)
            });
            settle(aborted, false);
            end_folds(unfolded, false);
        }
        SUBXACT_EVENT_COMMIT_SUB => OPEN.with_borrow_mut(|open| {
            for (_, _, sub) in open.debits.iter_mut() {
                if inside(*sub) {
                    *sub = parent;
                }
            }
            let subs = open.forget.iter_mut().map(|(_, sub)| sub).chain(open.folding.iter_mut().map(|(_, sub)| sub));
            for sub in subs {
                if inside(*sub) {
                    *sub = parent;
                }
            }
        }),
        _ => {}
    }
}
