//! What the write path of the state table deals in: which row a call means (`Slot`), a
//! stored state and where it is (`Row`), and what a write, a lock and a creation found.

use std::borrow::Cow;
use std::fmt::Write;

use pgrx::pg_sys::ItemPointerData;

use crate::bucket::State;
use crate::call::Fingerprint;

/// Whose state a row holds.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Owner {
    /// The limit named in `rate_limiter.limits`.
    Named,
    /// One inline config, by its fingerprint: callers that bring another config for the
    /// same (name, key) reach another row.
    Inline(Fingerprint),
    /// Every inline config of (name, key) at once, as 0.4.0 kept them: read only, as the
    /// state a config's own row starts from, so an update loses no inline limit's count.
    SharedInline,
}

/// Identifies one shard of one limit.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    pub name: &'a str,
    pub key: Option<&'a str>,
    pub shard: i32,
    pub owner: Owner,
}

/// How the `name` column marks an inline config's row: the name, this, and the config's
/// fingerprint in 32 lowercase hex digits. The suffix has a fixed length, so no two (name,
/// fingerprint) pairs make one text.
pub const FINGERPRINT_MARK: char = '#';

/// Whether `name` has the shape of an inline config's rows' name (`inline_name`): such a
/// name would reach those rows.
pub fn is_inline_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() > 33
        && bytes[bytes.len() - 33] == FINGERPRINT_MARK as u8
        && bytes[bytes.len() - 32..].iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// SQL: the `name` column is `$1` or, `$1` under any inline config (`inline_name`), of a
/// statement whose `$1` is a limit's name (qualified operators and functions throughout).
pub(super) fn named_or_inline_sql(inline_also: &str) -> String {
    format!(
        "(name OPERATOR(pg_catalog.=) $1 OR ({inline_also}pg_catalog.left(name, -33) OPERATOR(pg_catalog.=) $1 \
          AND pg_catalog.right(name, 33) OPERATOR(pg_catalog.~) '^{FINGERPRINT_MARK}[0-9a-f]{{32}}$'))"
    )
}

/// SQL: the `key` column is `$2`, or both are NULL; either way an index probe.
pub(super) fn key_is_second_param_sql(key: Option<&str>) -> &'static str {
    match key {
        Some(_) => "key OPERATOR(pg_catalog.=) $2",
        None => "key IS NULL AND $2::pg_catalog.text IS NULL",
    }
}

/// The `name` column of `name`'s rows: the name, followed for an inline config by its
/// fingerprint.
pub fn stored_name<'a>(name: &'a str, inline: Option<&Fingerprint>) -> Cow<'a, str> {
    match inline {
        Some(fingerprint) => Cow::Owned(inline_name(name, fingerprint)),
        None => Cow::Borrowed(name),
    }
}

/// The `name` column of the rows of `name` under the inline config of `fingerprint`.
pub fn inline_name(name: &str, fingerprint: &Fingerprint) -> String {
    let mut stored = String::with_capacity(name.len() + 1 + 2 * fingerprint.len());
    stored.push_str(name);
    stored.push(FINGERPRINT_MARK);
    for b in fingerprint {
        write!(stored, "{b:02x}").expect("writing to a String");
    }
    stored
}

impl<'a> Slot<'a> {
    /// Where the slot's row sorts: calls that lock several rows lock them in this order, so
    /// that they never deadlock on each other. Shards in ascending order, as a single call
    /// locks its own (`limiter/rows.rs`), whatever the `shard` column stores.
    pub fn order_key(&self) -> (Option<&'a str>, &'a str, Owner, i32) {
        (self.key, self.name, self.owner, self.shard)
    }

    /// The `name` column: the name, followed for an inline config by its fingerprint.
    pub(super) fn stored_name(&self) -> Cow<'a, str> {
        match &self.owner {
            Owner::Inline(fingerprint) => stored_name(self.name, Some(fingerprint)),
            Owner::Named | Owner::SharedInline => stored_name(self.name, None),
        }
    }

    /// The `shard` column: `shard` for named limits, `-1 - shard` for inline configs, so
    /// that prune() can tell rows of deleted named limits apart without a column of its own.
    pub(super) fn stored_shard(&self) -> i16 {
        let shard = self.shard as i16;
        if self.owner == Owner::Named { shard } else { -1 - shard }
    }
}

/// A stored state and where it is.
#[derive(Clone)]
pub struct Row {
    pub state: State,
    pub(super) tid: ItemPointerData,
}

pub enum Written {
    Done,
    /// Another transaction holds the row (only without waiting).
    Busy,
    /// A transaction that committed after this statement's snapshot changed the row:
    /// lock it to read its newest version.
    Moved,
}

pub enum Locked {
    Row(Row),
    Busy,
    /// Deleted meanwhile (by `reset_rate_limit`).
    Gone,
}

pub enum Created {
    Done(Row),
    /// A concurrent transaction created it first.
    Exists(Row),
    /// Another transaction is creating or deleting it (only without waiting).
    Busy,
}

#[cfg(test)]
mod tests {
    use super::{Owner, Slot};

    /// `rate_limit_all` locks rows in this order and a single call locks its shards in
    /// ascending order: an inline config's shards, stored as -1 - shard, sort as a single call
    /// takes them, or the two could each hold one shard and wait for the other's.
    #[test]
    fn shards_sort_as_a_single_call_locks_them_for_every_owner() {
        for owner in [Owner::Named, Owner::Inline([7; 16])] {
            let slot = |shard| Slot { name: "api", key: Some("k"), shard, owner };
            assert!(slot(1).order_key() < slot(3).order_key());
        }
    }
}
