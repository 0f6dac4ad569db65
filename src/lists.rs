//! Block and allow lists (Upstash's deny lists, rate-limiter-flexible's black and white
//! lists): a blocked (name, key) is denied, an allowed one is let through, until an instant,
//! without its state being read or written; an entry with no name applies to the key under
//! every limit, and a block wins over an allow. Looked up through each table's unique index,
//! and not at all while a table is empty (per-backend flags that the tables' triggers reset).

use crate::cache::{self, List};
use crate::call::Request;
use crate::clock;
use crate::storage::Lookup;

/// `until`: the third column of rate_limiter.blocks and allows (name, key, until, note,
/// created; see sql/bootstrap.sql). Their unique indexes are on (key, name).
const UNTIL: i32 = 3;

/// Until when (ms; infinite for ever) `name`'s `key` is in `list`, if it is, ended or not:
/// the later of its own entry and the key's entry under every limit. As committed now, as
/// configs are.
fn listed_until(list: List, name: &str, key: Option<&str>) -> Option<f64> {
    let open = || Lookup::list(list);
    if !cache::any_listed(list, || open().is_some_and(|l| l.find(&[]))) {
        return None;
    }
    let entries = open()?;
    [Some(name), None]
        .into_iter()
        .filter_map(|n| entries.find(&[key, n]).then(|| entries.column(UNTIL)).flatten())
        .map(clock::timestamptz_ms)
        .reduce(f64::max)
}

/// How long from now `req`'s (name, key) stays in `list` (infinite for ever), if it is in it
/// now. Reads the clock only when there is an entry.
fn listed_for(list: List, req: &Request<'_>) -> Option<f64> {
    let until = listed_until(list, req.name, req.key)?;
    let now = clock::now_ms();
    (until > now).then_some(until - now)
}

/// Where a (name, key) stands in the lists now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Listed {
    /// Blocked, for this many more milliseconds (`None`: for ever).
    Blocked(Option<f64>),
    Allowed,
}

/// Whether `req`'s (name, key) is blocked or allowed now (an override that exempts the key
/// allows it); a block wins. Its state is then neither read nor written.
pub fn listed(req: &Request<'_>) -> Option<Listed> {
    if let Some(left) = listed_for(List::Blocks, req) {
        return Some(Listed::Blocked(left.is_finite().then_some(left)));
    }
    (req.exempt || listed_for(List::Allows, req).is_some()).then_some(Listed::Allowed)
}
