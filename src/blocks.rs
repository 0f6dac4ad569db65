//! Block lists (Upstash's deny lists): a (name, key) is denied until an instant, without its
//! state being read or written; a block with no name applies to the key under every limit.
//! Looked up through the unique index of `rate_limiter.blocks`, and not at all while the
//! table is empty (a per-backend flag that the blocks trigger resets).

use std::ptr::null_mut;

use pgrx::prelude::*;

use crate::cache;
use crate::clock;
use crate::storage::{probe, text_key};

// Columns of rate_limiter.blocks (name, key, until, note, created; see sql/bootstrap.sql),
// and of its unique index (key, name).
const UNTIL: i32 = 3;
const INDEX_KEY: i16 = 1;
const INDEX_NAME: i16 = 2;

/// Until when (ms; infinite for ever) `name`'s `key` is blocked at `now`, if it is: the later
/// of its own block and the key's block under every limit. As committed now, as configs are.
pub fn blocked_until(name: &str, key: Option<&str>, now: f64) -> Option<f64> {
    let relations = cache::relations();
    let lockmode = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    // SAFETY: the extension's table and its unique index, opened, probed and closed here;
    // the slot is read only after a probe found a row.
    let until = |names: &[Option<&str>]| unsafe {
        let heap = pg_sys::table_open(relations.blocks, lockmode);
        let index = pg_sys::index_open(relations.blocks_key, lockmode);
        let tuple_slot = pg_sys::table_slot_create(heap, null_mut());
        let snapshot = pg_sys::GetLatestSnapshot();
        let mut latest: Option<f64> = None;
        if names.is_empty() {
            // Is there any row at all?
            latest = probe(heap, index, snapshot, &mut [], tuple_slot).then_some(0.0);
        }
        for name in names {
            let mut keys = [text_key(index, INDEX_KEY, key), text_key(index, INDEX_NAME, *name)];
            if probe(heap, index, snapshot, &mut keys, tuple_slot) {
                let mut isnull = false;
                let us = pg_sys::slot_getattr(tuple_slot, UNTIL, &mut isnull).value() as i64;
                let at = if us == i64::MAX { f64::INFINITY } else { clock::pg_us_to_ms(us) };
                latest = Some(latest.map_or(at, |l: f64| l.max(at)));
            }
        }
        pg_sys::ExecDropSingleTupleTableSlot(tuple_slot);
        pg_sys::index_close(index, pg_sys::NoLock as _);
        pg_sys::table_close(heap, pg_sys::NoLock as _);
        latest
    };
    if !cache::any_blocks(|| until(&[]).is_some()) {
        return None;
    }
    until(&[Some(name), None]).filter(|at| *at > now)
}
