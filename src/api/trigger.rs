//! The trigger on `rate_limiter.limits`, `blocks`, `allows`, `overrides` and `tiers` that
//! tells every backend to forget what it cached of them, that moves a hot limit's debits into
//! its base rows before the limit changes, and that keeps overrides and tiers with their limit. (A file of its own: `#[pg_trigger]` names the standard
//! `Result`, which the other files of `api` shadow with the extension's.)

use pgrx::prelude::*;

use crate::bucket::Config;
use crate::cache;
use crate::clock;
use crate::config::{self, LimitRow, Override};
use crate::error::Error;
use crate::limiter::{self, hot::Change};
use crate::overrides;
use crate::storage;
use crate::shmem::{deny_cache, gate};

/// Trigger on `rate_limiter.limits`, `blocks` and `allows`: tell every backend to drop its
/// cached configs and block flag; for a limit that is or becomes hot, wait for the calls in
/// flight first (docs/hot-limits.md, "Moving into and out of the mode under load").
#[pg_trigger]
fn _limits_changed<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByRust>>, PgHeapTupleError> {
    let relid = trigger.relation().map(|r| r.oid()).unwrap_or(pg_sys::InvalidOid);
    // Only a database updated to 0.4.0 has hot limits (an older one cannot even have its
    // relations looked up by this library).
    let has_hot = trigger.relation().is_ok_and(|r| r.tuple_desc().iter().any(|a| a.name() == "hot" && !a.is_dropped()));
    if has_hot && relid == cache::relations().limits {
        hot_limit_changing(trigger);
        memory_limit_changing(trigger);
        concurrency_limit_shrinking(trigger);
        overrides_follow_their_limit(trigger);
    }
    // By the relation's own columns: in a database older than 0.4.0 (its update under way)
    // the extension's relations cannot be looked up yet.
    let is_tiers = trigger.relation().is_ok_and(|r| r.name() == "tiers" && r.tuple_desc().iter().any(|a| a.name() == "tier"));
    if is_tiers {
        tier_stays_while_named(trigger);
    }
    let is_overrides = trigger.relation().is_ok_and(|r| r.name() == "overrides" && r.tuple_desc().iter().any(|a| a.name() == "tier"));
    if is_tiers || is_overrides {
        override_changing(trigger);
    }
    // SAFETY: `relid` is the trigger's own relation, open and locked by the executor in this
    // transaction (InvalidOid would only raise "cache lookup failed"); the message is queued
    // and sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
    deny_cache::forget_this_database();
    Ok(None)
}

/// Also in a logical replication apply worker: a subscriber may take only the limits, and
/// its own calls' escrows and log must follow them. Where it subscribes to the log too, the
/// publisher's fold arrives as changes of its own (a local one would insert base rows the
/// publisher's then collide with): its escrows are only forgotten. An apply worker never
/// refuses a TRUNCATE, which would stop replication.
fn hot_limit_changing(trigger: &PgTrigger<'_>) {
    let (applying, change) = hot_change();
    if matches!(trigger.op(), Ok(PgTriggerOperation::Truncate)) {
        limiter::hot::limits_truncated(if applying { Change::Replicated } else { Change::Local });
        if !applying {
            limiter::memory::limits_truncated();
        }
        return;
    }
    let hot = |row: &PgHeapTuple<'_, AllocatedByPostgres>| row.get_by_name::<bool>("hot").ok().flatten().unwrap_or(false);
    let name = |row: &PgHeapTuple<'_, AllocatedByPostgres>| row.get_by_name::<String>("name").ok().flatten().unwrap_or_default();
    let (old, new) = (trigger.old(), trigger.new());
    if let Some(old) = old.as_ref().filter(|row| hot(row)) {
        // Its debits are folded with the config they were admitted under. A config outside
        // the bounds (a limit defined before 0.5.0) folds nothing: while the limit stays hot
        // under its name, its log is replayed under the new config; else the change is
        // refused while the log holds its debits, which nothing could fold.
        let was = Config::try_from(&limit_row(old)).ok();
        let stays_hot = new.as_ref().is_some_and(|row| hot(row) && name(row) == name(old));
        if was.is_none() && !stays_hot && limiter::hot::logged(&name(old)) {
            Error::OutOfRange(format!(
                "the hot limit \"{}\" is outside the bounds, so its debits cannot be folded: define it again, \
                 hot, within them first",
                name(old)
            ))
            .raise()
        }
        limiter::hot::limit_changing(&name(old), was.map(|_| limit_row(old)).as_ref(), change);
    }
    if let Some(new) = new.as_ref().filter(|row| hot(row)) {
        let renamed = old.as_ref().is_none_or(|old| !hot(old) || name(old) != name(new));
        if renamed {
            limiter::hot::limit_changing(&name(new), None, change);
        }
    }
}

/// Whether this backend applies a subscription's changes, and where a change of a hot limit
/// it makes comes from (see `hot_limit_changing`).
fn hot_change() -> (bool, Change) {
    // SAFETY: plain values of this single-threaded backend, set at its start or by SET.
    let applying = unsafe {
        pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32
            && pg_sys::MyBackendType == pg_sys::BackendType::B_BG_WORKER
    };
    (applying, if applying && storage::log_is_subscribed() { Change::Replicated } else { Change::Local })
}

/// A change of a memory limit (docs/memory-limits.md) waits for the calls in flight, so that
/// the next call takes its counts on under the new config, as a durable limit's row is; a
/// memory limit deleted or renamed has its counts forgotten at commit. A limit moves between
/// durable and memory only by a DELETE and a new define, which starts its counts afresh:
/// an update that moves it is refused, but in an apply worker, which never refuses (its
/// counts start afresh there).
fn memory_limit_changing(trigger: &PgTrigger<'_>) {
    if matches!(trigger.op(), Ok(PgTriggerOperation::Truncate)) {
        return; // the hot limits' truncate forgets every escrow of the database
    }
    let memory = |row: &PgHeapTuple<'_, AllocatedByPostgres>| row.get_by_name::<bool>("durable").ok().flatten() == Some(false);
    let name = |row: &PgHeapTuple<'_, AllocatedByPostgres>| row.get_by_name::<String>("name").ok().flatten().unwrap_or_default();
    let (old, new) = (trigger.old(), trigger.new());
    if let (Some(old), Some(new)) = (&old, &new) {
        // SAFETY: plain values of this single-threaded backend, set at its start or by SET.
        let applying = unsafe { pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32 };
        if memory(old) != memory(new) && !applying {
            Error::NotSupported(format!(
                "moving the limit \"{}\" between durable and memory: DELETE it and define it again (its counts start afresh)",
                name(old)
            ))
            .raise()
        }
    }
    if let Some(old) = old.as_ref().filter(|row| memory(row)) {
        match new.as_ref().filter(|new| memory(new) && name(new) == name(old)) {
            // The configs its keys may be decided under now: the limit's, and its overrides'
            // and tiers' (a row outside the bounds is refused by calls, and gives none).
            Some(new) => limiter::memory::limit_changing(&name(old), || overrides::configs_in_force(&name(new), &limit_row(new), &[])),
            None => limiter::memory::limit_going(&name(old)),
        }
    }
}

/// Any change that can lower how many slots a concurrency name allows: wait for every
/// transaction that called a limit to end (and keep new calls out until this one does), so
/// that no transaction still holds a slot the new limit does not look at. That is every
/// insert, delete and truncate, and every update of rate, kind, name or `enforce`, with a
/// concurrency limit on either side, but for a rate raised with nothing else changed: the
/// rows in between may have been of another kind, or absent, while the slots of an earlier
/// concurrency limit of that name were still held. Leases are rows and still count.
fn concurrency_limit_shrinking(trigger: &PgTrigger<'_>) {
    let text = |row: &PgHeapTuple<'_, AllocatedByPostgres>, column: &str| row.get_by_name::<String>(column).ok().flatten();
    let rate = |row: &PgHeapTuple<'_, AllocatedByPostgres>| row.get_by_name::<f64>("rate").ok().flatten();
    let enforce = |row: &PgHeapTuple<'_, AllocatedByPostgres>| row.get_by_name::<bool>("enforce").ok().flatten();
    let concurrency = |row: &PgHeapTuple<'_, AllocatedByPostgres>| text(row, "kind").as_deref() == Some("concurrency");
    let lowers = match (trigger.old(), trigger.new()) {
        (Some(old), Some(new)) => {
            (concurrency(&old) || concurrency(&new))
                && !(concurrency(&old)
                    && concurrency(&new)
                    && rate(&new) >= rate(&old)
                    && text(&new, "name") == text(&old, "name")
                    && enforce(&new) == enforce(&old))
        }
        (Some(row), None) | (None, Some(row)) => concurrency(&row),
        (None, None) => matches!(trigger.op(), Ok(PgTriggerOperation::Truncate)),
    };
    if lowers {
        gate::hold_calls_off();
    }
}

/// A limit's overrides go with it (a DELETE, a TRUNCATE, a new name), and a limit whose
/// overrides end by `until` cannot become hot, memory or concurrency (see `override_changing`).
fn overrides_follow_their_limit(trigger: &PgTrigger<'_>) {
    if cache::relations().overrides.is_none() {
        return;
    }
    if matches!(trigger.op(), Ok(PgTriggerOperation::Truncate)) {
        storage::delete_overrides_of(None);
        return;
    }
    let name = |row: &PgHeapTuple<'_, AllocatedByPostgres>| row.get_by_name::<String>("name").ok().flatten().unwrap_or_default();
    let (old, new) = (trigger.old(), trigger.new());
    if let Some(old) = &old {
        if new.as_ref().is_none_or(|new| name(new) != name(old)) {
            storage::delete_overrides_of(Some(&name(old)));
        }
    }
    if let Some(new) = &new {
        let row = limit_row(new);
        let no_end = config::no_end_for(row.kind == "concurrency", row.hot, row.durable);
        if let Some(which) = no_end.filter(|_| storage::has_overrides_ending(&name(new))) {
            Error::NotSupported(format!(
                "the limit \"{}\" has overrides with an end (until), which a {which} limit's cannot have: remove_override() them first",
                name(new)
            ))
            .raise()
        }
    }
}

/// A change of an override or a tier changes its keys' numbers, as a change of their limit
/// does, and waits as that change waits: a concurrency limit's for every transaction that
/// called a limit to end (`concurrency_limit_shrinking`: no slot beyond a lowered number is
/// still held when the next call counts); a memory limit's for its calls in flight, whose
/// keys' entries then take on their new numbers at their next call
/// (`memory_limit_changing`). Any change of one; a TRUNCATE of either table, for every limit.
fn override_changing(trigger: &PgTrigger<'_>) {
    let name = |row: &PgHeapTuple<'_, AllocatedByPostgres>| row.get_by_name::<String>("name").ok().flatten();
    // An override that has ended gives no key numbers any more: deleting it (as prune() does)
    // changes nothing, and waits for nothing.
    let ended = |row: &PgHeapTuple<'_, AllocatedByPostgres>| {
        row.get_by_name::<TimestampWithTimeZone>("until").ok().flatten().is_some_and(|until| clock::timestamptz_ms(until) <= clock::now_ms())
    };
    let limits: Vec<(String, LimitRow)> = match (trigger.old(), trigger.new()) {
        (None, None) if matches!(trigger.op(), Ok(PgTriggerOperation::Truncate)) => storage::all_limits(),
        (old, new) => old
            .iter()
            .filter(|row| !ended(row))
            .chain(new.iter())
            .filter_map(name)
            .filter_map(|name| Some((name.clone(), storage::load_limit(&name)?)))
            .collect(),
    };
    if limits.iter().any(|(_, limit)| limit.kind == "concurrency") {
        gate::hold_calls_off();
    }
    // Each key's entry is taken on under every config a key of the limit may now have, the
    // changed rows' numbers among them (never pinned until its next call).
    let changing: Vec<Override> = trigger.old().iter().chain(trigger.new().iter()).map(override_numbers).collect();
    for (name, limit) in limits.iter().filter(|(_, limit)| !limit.durable) {
        limiter::memory::limit_changing(name, || overrides::configs_in_force(name, limit, &changing));
    }
    // Any `until` but 'infinity' ('-infinity' too, never in force) is an end, which would
    // change a hot or memory key's numbers under its calls in flight with nothing to wait for
    // them: remove_override() ends it.
    let is_overrides = trigger.relation().is_ok_and(|r| r.name() == "overrides");
    if let Some(new) = trigger.new().filter(|_| is_overrides) {
        let ends = new.get_by_name::<TimestampWithTimeZone>("until").ok().flatten().is_some_and(|until| clock::timestamptz_ms(until) != f64::INFINITY);
        let limit = name(&new).and_then(|name| limits.iter().find(|(n, _)| *n == name).map(|(_, limit)| limit));
        let no_end = limit.and_then(|limit| config::no_end_for(limit.kind == "concurrency", limit.hot, limit.durable));
        if let Some(which) = no_end.filter(|_| ends) {
            Error::NotSupported(format!(
                "an override of the {which} limit \"{}\" with an end: remove_override() it when it is to end",
                name(&new).unwrap_or_default()
            ))
            .raise()
        }
    }
    if limits.iter().any(|(_, limit)| limit.hot) {
        hot_keys_changing(trigger, limits.iter().map(|(name, _)| name));
    }
}

/// The keys of a hot limit whose numbers an override or a tier changes: each key's log is
/// folded under the numbers its debits were admitted under (the old row's), once no call is
/// in flight, as a redefinition folds the limit's; its escrow goes at commit. Such an
/// override has no end (`until`): its end would change the key's numbers under debits in
/// flight with nothing to fold them first. A TRUNCATE is refused while the log holds debits.
fn hot_keys_changing<'a>(trigger: &PgTrigger<'_>, names: impl Iterator<Item = &'a String>) {
    let (_, change) = hot_change();
    // Calls in flight waited for first, and so any change of the limit or its tiers: what
    // their debits were admitted under is read after, as committed now.
    if change == Change::Local {
        gate::hold_calls_off();
    }
    let mut limits: Vec<(String, LimitRow)> = Vec::new();
    for name in names {
        if !limits.iter().any(|(n, _)| n == name) {
            limits.extend(storage::load_limit(name).map(|limit| (name.clone(), limit)));
        }
    }
    let text = |row: &PgHeapTuple<'_, AllocatedByPostgres>, column: &str| row.get_by_name::<String>(column).ok().flatten();
    let hot = |name: &str| limits.iter().find(|(n, _)| n == name).filter(|(_, limit)| limit.hot).map(|(_, limit)| limit);
    let is_tiers = trigger.relation().is_ok_and(|r| r.name() == "tiers");
    let (old, new) = (trigger.old(), trigger.new());
    if old.is_none() && new.is_none() {
        if is_tiers {
            return; // no key is in a tier (`tier_stays_while_named`): no key's numbers change
        }
        for (name, _) in limits.iter().filter(|(_, limit)| limit.hot) {
            if change == Change::Local && limiter::hot::logged(name) {
                Error::NotSupported(format!(
                    "TRUNCATE of the overrides or tiers while the hot limit \"{name}\" has debits not yet folded: DELETE the rows instead, which folds"
                ))
                .raise()
            }
            limiter::hot::limit_changing(name, None, change);
        }
        return;
    }
    // The keys whose numbers change, each with the config its debits were admitted under.
    let mut was: Vec<(String, Option<String>, Config)> = Vec::new();
    // Numbers the limit's kind cannot have admitted nothing: no debit of theirs to fold.
    let config = |row: &LimitRow, numbers: &Override| Config::try_from(&numbers.applied_to(row)).ok();
    if let Some(old) = &old {
        let Some(name) = text(old, "name") else { return };
        if let Some(limit) = hot(&name) {
            if is_tiers {
                let numbers = override_numbers(old);
                if let Some(config) = config(limit, &numbers) {
                    for key in storage::keys_in_tier(&name, &text(old, "tier").unwrap_or_default()) {
                        was.push((name.clone(), key, config));
                    }
                }
            } else {
                let numbers = match text(old, "tier") {
                    Some(tier) => storage::load_tier(&name, &tier).map(|(numbers, _)| numbers).unwrap_or_default(),
                    None => override_numbers(old),
                };
                was.extend(config(limit, &numbers).map(|config| (name.clone(), text(old, "key"), config)));
            }
        }
    }
    if let Some(new) = new.as_ref().filter(|_| !is_tiers) {
        let key = (text(new, "name"), text(new, "key"));
        let same = old.as_ref().is_some_and(|old| (text(old, "name"), text(old, "key")) == key);
        if let (Some(name), false) = (key.0.as_deref(), same) {
            // A key that had no override: its debits were the limit's own numbers'.
            if let Some(limit) = hot(name) {
                was.extend(config(limit, &Override::default()).map(|config| (name.to_owned(), key.1.clone(), config)));
            }
        }
    }
    // One fold per limit (a renamed override touches two), its log opened once for its keys.
    for (name, _) in &limits {
        let keys: Vec<(Option<String>, Config)> =
            was.iter().filter(|(n, _, _)| n == name).map(|(_, key, config)| (key.clone(), *config)).collect();
        limiter::hot::keys_changing(name, &keys, change);
    }
}

/// The numbers of a row of `rate_limiter.overrides` or `tiers` as the trigger gets it.
fn override_numbers(row: &PgHeapTuple<'_, AllocatedByPostgres>) -> Override {
    Override {
        rate: row.get_by_name("rate").ok().flatten(),
        period: row.get_by_name("period").ok().flatten(),
        capacity: row.get_by_name("capacity").ok().flatten(),
        max_reserved: row.get_by_name("max_reserved").ok().flatten(),
        min_gap: row.get_by_name("min_gap").ok().flatten(),
    }
}

/// A tier that an override names stays, under its name: deleting, renaming or truncating it
/// is refused (23503), as a foreign key would (the tables have none, so that `pg_dump` may
/// restore their rows in any order).
fn tier_stays_while_named(trigger: &PgTrigger<'_>) {
    let text = |row: &PgHeapTuple<'_, AllocatedByPostgres>, column: &str| row.get_by_name::<String>(column).ok().flatten();
    let gone = match (trigger.old(), trigger.new()) {
        (Some(old), new) => {
            let pair = |row: &PgHeapTuple<'_, AllocatedByPostgres>| (text(row, "name"), text(row, "tier"));
            let renamed = new.as_ref().is_none_or(|new| pair(new) != pair(&old));
            renamed.then(|| pair(&old))
        }
        _ => None,
    };
    if let Some((Some(name), Some(tier))) = gone {
        let overrides = storage::overrides_naming(&name, &tier);
        if overrides > 0 {
            Error::TierInUse { name, tier, overrides }.raise()
        }
    }
    if matches!(trigger.op(), Ok(PgTriggerOperation::Truncate)) && storage::overrides_naming_any_tier() {
        Error::NotSupported("TRUNCATE of rate_limiter.tiers while overrides name tiers: move or remove those overrides first".into())
            .raise()
    }
}

/// A row of `rate_limiter.limits` as the trigger gets it.
fn limit_row(row: &PgHeapTuple<'_, AllocatedByPostgres>) -> LimitRow {
    let required = "NOT NULL column of rate_limiter.limits";
    LimitRow {
        kind: row.get_by_name("kind").ok().flatten().expect(required),
        rate: row.get_by_name("rate").ok().flatten().expect(required),
        period: row.get_by_name("period").ok().flatten().expect(required),
        capacity: row.get_by_name("capacity").ok().flatten(),
        max_reserved: row.get_by_name("max_reserved").ok().flatten(),
        shards: row.get_by_name("shards").ok().flatten().expect(required),
        start: row.get_by_name("start").ok().flatten(),
        min_gap: row.get_by_name("min_gap").ok().flatten(),
        mode: row.get_by_name("mode").ok().flatten().expect(required),
        buckets: row.get_by_name("buckets").ok().flatten(),
        lock_timeout: row.get_by_name("lock_timeout").ok().flatten(),
        on_lock_timeout: row.get_by_name("on_lock_timeout").ok().flatten().expect(required),
        deny_cache: row.get_by_name("deny_cache").ok().flatten(),
        // As stored: a memory limit's config is refused with hot => true (a row of a database
        // older than 0.4.0 has no hot column, and is no hot limit).
        hot: row.get_by_name("hot").ok().flatten().unwrap_or(false),
        durable: row.get_by_name("durable").ok().flatten().unwrap_or(true),
        enforce: row.get_by_name("enforce").ok().flatten().unwrap_or(true),
        tz: row.get_by_name("tz").ok().flatten(),
    }
}
