//! The shards of durable limits whose rows this transaction holds locked (written or locked
//! by its calls), by limit and key: a call queues for a shard's row only above every shard
//! of that key it holds (`rows::waitable`), and the shards held by the transaction's earlier
//! calls count, or two transactions that each took from a key could each wait, in their next
//! call, for the shard the other holds (40P01). Forgotten when the transaction ends, and what
//! a subtransaction took when it aborts, which gives those locks back.

use crate::call::{Fingerprint, Request};
use crate::transaction::{Ending, Held};

/// (name, key, inline config): whose rows, as a `Slot` names them.
type Whose = (String, Option<String>, Option<Fingerprint>);

thread_local! {
    /// Each (name, key, config)'s held shards: found by the key, not searched, however many
    /// keys the transaction calls.
    static HELD: Held<Whose, i32> = Held::default();
}

fn whose(req: &Request<'_>) -> Whose {
    (req.name.to_owned(), req.key.map(str::to_owned), req.inline)
}

/// The shards of `req`'s (name, key, config) this transaction holds.
pub fn of(req: &Request<'_>) -> Vec<i32> {
    HELD.with(|held| held.copied(&whose(req)))
}

/// `shard` of `req`'s rows, of a limit of `shards` shards, is held, until the transaction (or
/// the current subtransaction, if it aborts) ends. Only a sharded limit's shards are noted: a
/// call of a limit of one shard takes shard 0 whatever it holds.
pub fn note(req: &Request<'_>, shard: i32, shards: u32) {
    if shards == 1 {
        return;
    }
    let whose = whose(req);
    HELD.with(|held| {
        if !held.with_items(&whose, |shards| shards.iter().any(|(s, _)| *s == shard)) {
            held.add(whose, shard);
        }
    });
}

/// The transaction's end (`transaction::register`): the locks are given back.
pub fn at_end(ending: Ending) {
    HELD.with(|held| held.forget(ending));
}
