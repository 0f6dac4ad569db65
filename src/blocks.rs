//! Block lists (Upstash's deny lists): a (name, key) is denied until an instant, without its
//! state being read or written; a block with no name applies to the key under every limit.
//! Looked up through the unique index of `rate_limiter.blocks`, and not at all while the
//! table is empty (a per-backend flag that the blocks trigger resets).

use crate::cache;
use crate::call::{Decision, Reason, Request};
use crate::clock;
use crate::storage::Lookup;

/// `until`: the third column of rate_limiter.blocks (name, key, until, note, created; see
/// sql/bootstrap.sql). Its unique index is on (key, name).
const UNTIL: i32 = 3;

/// Until when (ms; infinite for ever) `name`'s `key` has a block, if it has one, ended or
/// not: the later of its own block and the key's block under every limit. As committed now,
/// as configs are.
fn blocked_until(name: &str, key: Option<&str>) -> Option<f64> {
    let open = Lookup::blocks;
    if !cache::any_blocks(|| open().find(&[])) {
        return None;
    }
    let blocks = open();
    [Some(name), None]
        .into_iter()
        .filter_map(|n| blocks.find(&[key, n]).then(|| blocks.column(UNTIL)).flatten())
        .map(clock::timestamptz_ms)
        .reduce(f64::max)
}

/// The denial of `req` if its (name, key) is blocked now: its state is neither read nor
/// written, so `remaining` is 0; an indefinite block has no `retry_after`. Reads the clock
/// only when there is a block.
pub fn blocked(req: &Request<'_>) -> Option<Decision> {
    let until = blocked_until(req.name, req.key)?;
    let now = clock::now_ms();
    if until <= now {
        return None;
    }
    let retry_after = until.is_finite().then_some(until - now);
    Some(Decision {
        ok: false,
        retry_after,
        remaining: 0.0,
        reset_after: retry_after.unwrap_or(0.0),
        granted: 0.0,
        reason: Some(Reason::Blocked),
        limited_by: Some(req.name.to_owned()),
    })
}
