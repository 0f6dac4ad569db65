//! Overrides (`rate_limiter.overrides`): a key of a named limit decided under numbers of its
//! own or its tier's (`rate_limiter.tiers`), counted in the same rows, so that a change of
//! plan neither hands out a fresh window nor takes one away. Looked up through the tables'
//! unique indexes: not at all while there is no override; a limit's overridden keys read
//! whole once per backend, so that a key without one costs a lookup in memory; a key with
//! one read once per backend. Kept until the tables or the limits change (`cache`, whose
//! entries the tables' triggers invalidate).

use crate::bucket::{Config, Kind};
use crate::cache::{self, Overridden};
use crate::call::Request;
use crate::clock;
use crate::config::{self, LimitRow, Override};
use crate::error::{Error, Result};
use crate::storage::{self, Overriding};

/// Whether `req`'s key may have an override: answered from memory but for a key the limit
/// overrides.
fn may_have_one(req: &Request<'_>) -> bool {
    cache::any_override(storage::any_override)
        && cache::may_be_overridden(req.name, req.key, |most| storage::overridden_keys(req.name, most))
}

/// The override of `req`'s key in force now under its named limit, if it has one.
fn in_force(req: &Request<'_>) -> Result<Option<Overridden>> {
    if !may_have_one(req) {
        return Ok(None);
    }
    let found = cache::overridden(req.name, req.key, || load(req.name, req.key))?;
    Ok(found.filter(|o| o.until > clock::now_ms()))
}

/// The override of `name`'s `key` as committed now (its numbers, or its tier's), applied to
/// the limit's row.
fn load(name: &str, key: Option<&str>) -> Result<Option<Overridden>> {
    let Some((overriding, until)) = storage::load_override(name, key) else { return Ok(None) };
    let (numbers, exempt) = numbers_of(name, overriding)?;
    Ok(Some(Overridden { config: applied(name, &numbers)?, exempt, until: clock::timestamptz_ms(until) }))
}

/// The config of the limit `name` with `numbers` in place of its own, checked as `define`
/// checks a limit's: refused for a limit that does not exist and numbers its kind could not
/// have. What `override` and `define_tier` accept, and what a call is decided under.
pub fn applied(name: &str, numbers: &Override) -> Result<Config> {
    let row = storage::load_limit(name).ok_or_else(|| Error::UnknownLimit(name.to_owned()))?;
    Config::try_from(&numbers.applied_to(&row))
}

/// The most configs `configs_in_force` gives: each memory key's expiry is computed under
/// each of them at the change's commit, under its partition's lock.
const MOST_CONFIGS_IN_FORCE: usize = 32;

/// Every config a key of `name` may be decided under when the limit's row is `row`, each
/// once: the row's own, and each override's and tier's numbers in force applied to it, with
/// `changing` (the numbers a change under way gives or takes). Numbers the row cannot have are
/// left out (such a key's calls are refused). None past `MOST_CONFIGS_IN_FORCE`.
pub fn configs_in_force(name: &str, row: &LimitRow, changing: &[Override]) -> Option<Vec<Config>> {
    let mut configs: Vec<Config> = Vec::new();
    let numbers = std::iter::once(Override::default()).chain(changing.iter().copied()).chain(storage::numbers_given(name));
    for config in numbers.filter_map(|n| Config::try_from(&n.applied_to(row)).ok()) {
        if !configs.contains(&config) {
            if configs.len() == MOST_CONFIGS_IN_FORCE {
                return None;
            }
            configs.push(config);
        }
    }
    Some(configs)
}

/// Whether the overrides and tiers of `name` still give numbers the limit's new row `row` can
/// have: else the first that does not, as its key's calls would be refused (22023, 0A000).
/// After `define` wrote the row, so that an `override()` it waited for is seen.
pub fn fit(name: &str, row: &LimitRow) -> Result<()> {
    storage::numbers_given(name).iter().try_for_each(|numbers| Config::try_from(&numbers.applied_to(row)).map(|_| ()))
}

/// The numbers `overriding` gives, as committed now (a tier's, looked up), and whether they
/// exempt the key.
pub fn numbers_of(name: &str, overriding: Overriding) -> Result<(Override, bool)> {
    match overriding {
        Overriding::Numbers(numbers, exempt) => Ok((numbers, exempt)),
        Overriding::Tier(tier) => storage::load_tier(name, &tier).ok_or(Error::UnknownTier { name: name.to_owned(), tier }),
    }
}

/// The config `key` of `name` is decided under when the limit's row is `row`: its override's
/// numbers (or its tier's), as committed now, applied to `row`; else `row`'s own. What a hot
/// limit's key was admitted under, for the fold of its log when the row changes.
pub fn config_under(row: &LimitRow, name: &str, key: Option<&str>) -> Result<Config> {
    let numbers = numbers_in_force(name, key)?.map_or_else(Override::default, |(numbers, _)| numbers);
    Config::try_from(&numbers.applied_to(row))
}

/// The numbers of the override of `name`'s `key` in force now, as committed now, and whether
/// they exempt the key; None when it has none, or one that has ended.
fn numbers_in_force(name: &str, key: Option<&str>) -> Result<Option<(Override, bool)>> {
    match storage::load_override(name, key) {
        Some((overriding, until)) if clock::timestamptz_ms(until) > clock::now_ms() => numbers_of(name, overriding).map(Some),
        _ => Ok(None),
    }
}

/// The config an inline call `req` is decided under: `config`, parsed from `json`, with its
/// key's override in force (the named limit's of that name) given as `json`'s members in
/// place of its own, the rest the call's; `req` is marked exempt when the override exempts
/// it. The call is counted by its own config's fingerprint all the same, so that a plan's
/// change keeps its count, and a store that passes its numbers inline honours the override
/// unchanged. Refused (0A000) for a concurrency or memory config, whose change of numbers
/// waits for the calls in flight of a named limit only. Read at each call: a key without
/// one costs what a named limit's does.
pub fn inline_config_for(req: &mut Request<'_>, config: Config, json: &serde_json::Value) -> Result<Config> {
    if !may_have_one(req) {
        return Ok(config);
    }
    let Some((numbers, exempt)) = numbers_in_force(req.name, req.key)? else { return Ok(config) };
    if config.kind == Kind::Concurrency || !config.durable {
        return Err(Error::NotSupported(format!(
            "an override of \"{}\" for an inline {} config: define the limit by name and call it so",
            req.name,
            if config.durable { "concurrency" } else { "memory" }
        )));
    }
    req.exempt = exempt;
    config::from_json(&numbers.in_json(json))
}

/// The config `req` is decided under: its key's override's when one is in force, else
/// `config`, its limit's; `req` is marked exempt when the override exempts it.
pub fn config_for(req: &mut Request<'_>, config: Config) -> Result<Config> {
    let found = in_force(req)?;
    req.exempt = found.is_some_and(|o| o.exempt);
    Ok(found.map_or(config, |o| o.config))
}
