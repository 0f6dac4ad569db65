//! Overrides (`rate_limiter.overrides`): a key of a named limit decided under numbers of its
//! own or its tier's (`rate_limiter.tiers`), counted in the same rows, so that a change of
//! plan neither hands out a fresh window nor takes one away. Looked up through the tables'
//! unique indexes: not at all while there is no override; a limit's overridden keys read
//! whole once per backend, so that a key without one costs a lookup in memory; a key with
//! one read once per backend. Kept until the tables or the limits change (`cache`, whose
//! entries the tables' triggers invalidate).

use crate::bucket::Config;
use crate::cache::{self, Overridden};
use crate::call::Request;
use crate::clock;
use crate::config::{LimitRow, Override};
use crate::error::{Error, Result};
use crate::storage::{self, Overriding};

/// The override of `req`'s key in force now, if it has one: none for an inline config.
fn in_force(req: &Request<'_>) -> Result<Option<Overridden>> {
    if req.inline.is_some()
        || !cache::any_override(storage::any_override)
        || !cache::may_be_overridden(req.name, req.key, |most| storage::overridden_keys(req.name, most))
    {
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
    let numbers = match storage::load_override(name, key) {
        Some((overriding, _)) => numbers_of(name, overriding)?.0,
        None => Override::default(),
    };
    Config::try_from(&numbers.applied_to(row))
}

/// The config `req` is decided under: its key's override's when one is in force, else
/// `config`, its limit's; `req` is marked exempt when the override exempts it.
pub fn config_for(req: &mut Request<'_>, config: Config) -> Result<Config> {
    let found = in_force(req)?;
    req.exempt = found.is_some_and(|o| o.exempt);
    Ok(found.map_or(config, |o| o.config))
}
