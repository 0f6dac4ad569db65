//! What the write path of the state table deals in: which row a call means (`Slot`), a
//! stored state and where it is (`Row`), and what a write, a lock and a creation found.

use pgrx::pg_sys::ItemPointerData;

use crate::bucket::State;

/// Identifies one shard of one limit.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    pub name: &'a str,
    pub key: Option<&'a str>,
    pub shard: i32,
    /// The config was passed inline rather than named in `rate_limiter.limits`.
    pub inline: bool,
}

impl<'a> Slot<'a> {
    /// Where the slot's row sorts in the unique index: calls that lock several rows lock
    /// them in this order, so that they never deadlock on each other.
    pub fn order_key(&self) -> (Option<&'a str>, &'a str, i16) {
        (self.key, self.name, self.stored_shard())
    }

    /// The `shard` column: `shard` for named limits, `-1 - shard` for inline configs, so
    /// that prune() can tell rows of deleted named limits apart without a column of its own.
    pub(super) fn stored_shard(&self) -> i16 {
        let shard = self.shard as i16;
        if self.inline { -1 - shard } else { shard }
    }
}

/// A stored state and where it is.
#[derive(Clone, Copy)]
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

// A `Row` holds its `State` by value (a rolling window's cells included): boxing it would
// allocate on every call to spare a copy.
#[allow(clippy::large_enum_variant)]
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
