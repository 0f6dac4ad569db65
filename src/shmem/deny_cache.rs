//! The deny cache (Upstash's ephemeral cache, in shared memory): for a limit with
//! `deny_cache`, a consuming call that is denied for want of tokens leaves "(name, key) is
//! denied until T" in a slot of a direct-mapped table, and for at most `deny_cache` after it,
//! calls for that (name, key) are denied from the slot without reading the state.
//!
//! It only ever denies, and only what a real denial just found, so it cannot let anything
//! through; what it may do is deny a little longer than the state would: after tokens come
//! back early (a rollback of another transaction, `reset_rate_limit`, `define`, a direct
//! write to the tables), for at most the limit's `deny_cache`. `reset_rate_limit` and
//! `credit` forget their key's denial, every change to `rate_limiter.limits`,
//! `rate_limiter.blocks` or `rate_limiter.allows` the slots of its database, and `DROP
//! DATABASE` those of the database it drops, as soon as they run:
//! each slot holds its database's OID, and no other database's change empties it. (0.4.0
//! kept a generation number per database OID modulo 1,024, so a role that could create a
//! database with a chosen OID could empty another database's cache at will.)
//!
//! A slot answers only for the exact (database, name, key) it holds, compared in full, never
//! by hash alone: no caller can craft a pair whose denial answers for another's. Pairs longer
//! than a slot holds (`PAIR_BYTES`) are not cached.

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

use pgrx::pg_sys;

use crate::bucket::Config;
use crate::call::{Decision, Reason, Request};
use crate::clock;
use crate::hash;
use crate::settings;
use super::area;


const SHMEM_NAME: &CStr = c"rate_limiter deny cache";

/// Bytes of (name, key, config) a slot holds: any name with a key of up to 126 bytes less
/// than the name's length, 16 less under an inline config.
const PAIR_BYTES: usize = 128;
const PAIR_WORDS: usize = PAIR_BYTES / 8;

#[repr(C)]
struct Header {
    /// A power of two.
    slots: u64,
}

/// One cached denial; f64 fields are stored as bits, instants in the limiter's ms. Every
/// field is written between two bumps of `seq` (a seqlock), so a reader that sees the same
/// even `seq` before and after reading them read one writer's values.
#[repr(C, align(64))]
struct Slot {
    /// Even while readable, odd while a writer fills the slot; 0 for never written.
    seq: AtomicU64,
    /// The (database, name, key) hash: a quick first comparison.
    tag: AtomicU64,
    /// Until when the slot may answer.
    expires: AtomicU64,
    /// When the denied call could pass (its `retry_after` from then).
    retry_at: AtomicU64,
    remaining: AtomicU64,
    reset_at: AtomicU64,
    database: AtomicU32,
    /// Bytes of `pair` in use.
    len: AtomicU32,
    /// The (name, key, config) bytes, compared in full before a slot answers.
    pair: [AtomicU64; PAIR_WORDS],
}

static AREA: AtomicPtr<Header> = AtomicPtr::new(null_mut());

fn slot_count() -> u64 {
    match settings::DENY_CACHE_SLOTS.get() {
        0 => 0,
        n => (n as u64).next_power_of_two(),
    }
}

fn size(slots: u64) -> usize {
    area::table_size::<Header, Slot>(slots as usize)
}

/// The header and slots, when the library was preloaded with slots.
fn table() -> Option<(&'static Header, &'static [Slot])> {
    let header = AREA.load(Acquire);
    // SAFETY: set by `attach` to an area of `size(slots)` bytes that lives as long as the
    // server, laid out as a header and then the slots.
    unsafe {
        let header = header.as_ref()?;
        let first = header as *const Header as *const u8;
        let slots = first.add(area::entries_offset::<Header, Slot>()).cast::<Slot>();
        Some((header, std::slice::from_raw_parts(slots, header.slots as usize)))
    }
}

/// The postmaster's shmem request.
///
/// # Safety
/// Only from `shmem_request_hook`.
pub unsafe fn request() {
    if slot_count() > 0 {
        // SAFETY: the caller is the shmem request hook, where PostgreSQL 15 accepts this request
        // (elsewhere it raises FATAL).
        unsafe { pg_sys::RequestAddinShmemSpace(size(slot_count())) };
    }
}

/// Create the table (at start and after a crash) or attach to it.
///
/// # Safety
/// Only from `shmem_startup_hook`, holding AddinShmemInitLock.
pub unsafe fn attach() {
    let slots = slot_count();
    if slots == 0 {
        return;
    }
    // SAFETY: this function's own contract: from the startup hook, holding
    // AddinShmemInitLock; `request` asked for this size.
    let (area, found) = unsafe { area::area(SHMEM_NAME, size(slots)) };
    if !found {
        // SAFETY: a new area of the requested size, all zeros (every slot empty).
        unsafe {
            area.cast::<Header>().write(Header { slots })
        };
    }
    AREA.store(area.cast::<Header>(), Release);
}

/// Empty this database's part of the table: every slot it wrote before now answers nothing.
/// Once per command: a statement that changes many rows of the limits, blocks or allows
/// (whose trigger runs this per row) scans the table once.
pub fn forget_this_database() {
    // SAFETY: plain reads of this backend's transaction state, inside a transaction.
    let command = unsafe { (pg_sys::GetTopTransactionIdIfAny().into_inner(), pg_sys::GetCurrentCommandId(false)) };
    if command.0 != 0 && LAST_FORGET.replace(Some(command)) == Some(command) {
        return;
    }
    forget(|database, _| database == area::my_database());
}

/// Empty a dropped database's part of the table, before a new one can have its OID.
pub fn forget_database(database: pg_sys::Oid) {
    forget(|held, _| held == database.to_u32());
}

/// Forget the denial cached for (name, key) in this database, named or under any inline
/// config: what a credit or a reset of that key gives back. Its slot is the one the pair's
/// tag maps to.
pub fn forget_pair(name: &str, key: Option<&str>) {
    let Some((_, slots)) = table() else { return };
    let req = Request { name, key, count: 0.0, reserve: false, inline: None, exempt: false };
    if let Some((tag, _, _)) = identity(area::my_database(), &req) {
        empty_if(&slots[tag as usize & (slots.len() - 1)], |_, held| held == tag);
    }
}

thread_local! {
    /// The (transaction, command) of the last `forget_this_database`.
    static LAST_FORGET: std::cell::Cell<Option<(u32, u32)>> = const { std::cell::Cell::new(None) };
}

/// Every slot for which `whose(database, tag)` holds emptied: one pass over the table
/// (16,384 slots by default, tens of microseconds).
fn forget(whose: impl Fn(u32, u64) -> bool) {
    let Some((_, slots)) = table() else { return };
    for slot in slots {
        empty_if(slot, &whose);
    }
}

/// Empty `slot` (it answers nothing, and no later forget looks at it) if it holds a denial
/// for which `whose(database, tag)` holds.
fn empty_if(slot: &Slot, whose: impl Fn(u32, u64) -> bool) {
    loop {
        let seq = slot.seq.load(Acquire);
        if seq % 2 == 1 {
            // A writer is filling it (a few plain stores, nothing that can fail): a moment.
            std::hint::spin_loop();
            continue;
        }
        let database = slot.database.load(Relaxed);
        if seq == 0 || database == 0 || !whose(database, slot.tag.load(Relaxed)) {
            return;
        }
        if slot.seq.compare_exchange(seq, seq + 1, Acquire, Relaxed).is_ok() {
            fence(Release);
            slot.expires.store(0, Relaxed);
            slot.tag.store(0, Relaxed);
            slot.database.store(0, Relaxed);
            slot.seq.store(seq + 2, Release);
            return;
        }
    }
}

/// What a slot holds of `req`, in this database: its tag, and its (name, key, config)
/// bytes as words, with their length; `None` when they do not fit a slot. The table serves
/// every database of the cluster, and each has its own limits. Separators no name holds keep
/// (name, key) pairs from running into each other; an inline config's fingerprint keeps its
/// denials apart from a named limit's and every other config's, as their rows are. The tag
/// (and so the slot) is the pair's alone, so `forget_pair` finds a denial under any config.
fn identity(database: u32, req: &Request<'_>) -> Option<(u64, [u64; PAIR_WORDS], u32)> {
    let key: [&[u8]; 2] = match req.key {
        Some(key) => [&[0xff], key.as_bytes()],
        None => [&[0xfe], &[]],
    };
    let owner: [&[u8]; 2] = match &req.inline {
        Some(fingerprint) => [&[1], fingerprint],
        None => [&[0], &[]],
    };
    let parts = [req.name.as_bytes(), key[0], key[1], owner[0], owner[1]];
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > PAIR_BYTES {
        return None;
    }
    let mut bytes = [0u8; PAIR_BYTES];
    let mut at = 0;
    for part in parts {
        bytes[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    let words = std::array::from_fn(|i| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes")));
    let pair_len = req.name.len() + key[0].len() + key[1].len();
    let tag = hash::of([&database.to_le_bytes()[..], &bytes[..pair_len]]);
    Some((tag, words, len as u32))
}

fn load(cell: &AtomicU64) -> f64 {
    f64::from_bits(cell.load(Relaxed))
}

fn store(cell: &AtomicU64, v: f64) {
    cell.store(v.to_bits(), Relaxed)
}

/// The cached denial of `req`, if its limit has a deny cache and one is in force.
pub fn answer(req: &Request<'_>, config: &Config) -> Option<Decision> {
    config.deny_cache?;
    let (_, slots) = table()?;
    let (tag, words, len) = identity(area::my_database(), req)?;
    let slot = &slots[tag as usize & (slots.len() - 1)];
    let seq = slot.seq.load(Acquire);
    if seq % 2 == 1 || slot.tag.load(Relaxed) != tag {
        return None;
    }
    let (expires, retry_at) = (load(&slot.expires), load(&slot.retry_at));
    let (remaining, reset_at) = (load(&slot.remaining), load(&slot.reset_at));
    let (database, held_len) = (slot.database.load(Relaxed), slot.len.load(Relaxed));
    let same_pair = slot.pair.iter().zip(words).all(|(held, word)| held.load(Relaxed) == word);
    // Read again after the fields: a writer that came in between bumped it.
    fence(Acquire);
    if slot.seq.load(Relaxed) != seq {
        return None;
    }
    if !same_pair || held_len != len || database != area::my_database() {
        return None;
    }
    let now = clock::now_ms();
    if now >= expires {
        return None;
    }
    Some(Decision {
        ok: false,
        retry_after: Some(retry_at - now),
        remaining,
        reset_after: (reset_at - now).max(0.0),
        granted: 0.0,
        reason: Some(Reason::Exhausted),
        limited_by: Some(req.name.to_owned()),
    })
}

/// Keep `d` for `req` if it is a denial for want of tokens of a limit with a deny cache.
/// Skipped when another backend is writing the same slot: it is only a cache.
pub fn remember(req: &Request<'_>, config: &Config, d: &Decision) {
    let (Some(ttl), false, Some(retry_after)) = (config.deny_cache, d.ok, d.retry_after) else { return };
    if d.reason != Some(Reason::Exhausted) || retry_after <= 0.0 {
        return;
    }
    let Some((_, slots)) = table() else { return };
    let Some((tag, words, len)) = identity(area::my_database(), req) else { return };
    let slot = &slots[tag as usize & (slots.len() - 1)];
    // Read before the slot is taken: nothing between its odd and even seq may fail.
    let now = clock::now_ms();
    let database = area::my_database();
    let seq = slot.seq.load(Relaxed);
    if seq % 2 == 1 || slot.seq.compare_exchange(seq, seq + 1, Acquire, Relaxed).is_err() {
        return;
    }
    // The odd seq is seen before any field written below.
    fence(Release);
    slot.tag.store(tag, Relaxed);
    slot.database.store(database, Relaxed);
    slot.len.store(len, Relaxed);
    for (held, word) in slot.pair.iter().zip(words) {
        held.store(word, Relaxed);
    }
    store(&slot.expires, now + retry_after.min(ttl));
    store(&slot.retry_at, now + retry_after);
    store(&slot.remaining, d.remaining);
    store(&slot.reset_at, now + d.reset_after);
    slot.seq.store(seq + 2, Release);
}

#[cfg(test)]
mod tests {
    use super::{identity, PAIR_BYTES};
    use crate::call::Request;

    fn req<'a>(name: &'a str, key: Option<&'a str>, inline: Option<[u8; 16]>) -> Request<'a> {
        Request { name, key, count: 1.0, reserve: false, inline, exempt: false }
    }

    #[test]
    fn pairs_that_could_run_into_each_other_are_told_apart() {
        let of = |r: Request<'_>| identity(7, &r).map(|(_, words, len)| (words, len));
        let pairs = [
            req("ab", Some("c"), None),
            req("a", Some("bc"), None),
            req("abc", None, None),
            req("abc", Some(""), None),
            req("ab", Some("c"), Some([0; 16])),
            req("ab", Some("c"), Some([1; 16])),
        ];
        for (i, a) in pairs.iter().enumerate() {
            for b in &pairs[i + 1..] {
                let (a, b) = (req(a.name, a.key, a.inline), req(b.name, b.key, b.inline));
                assert_ne!(of(a), of(b));
            }
        }
    }

    #[test]
    fn every_config_of_a_pair_has_the_pairs_tag() {
        let tag = |inline| identity(7, &req("ab", Some("c"), inline)).unwrap().0;
        assert_eq!(tag(None), tag(Some([0; 16])));
        assert_eq!(tag(Some([0; 16])), tag(Some([1; 16])));
        assert_ne!(tag(None), identity(7, &req("ab", Some("d"), None)).unwrap().0);
    }

    #[test]
    fn the_database_is_part_of_the_tag_and_long_pairs_are_not_held() {
        let r = req("login", Some("alice"), None);
        assert_ne!(identity(1, &r).unwrap().0, identity(2, &r).unwrap().0);
        assert_eq!(identity(1, &r).unwrap().1, identity(2, &r).unwrap().1, "the bytes are the pair's alone");
        let fits = "k".repeat(PAIR_BYTES - "login".len() - 2);
        assert!(identity(1, &req("login", Some(&fits), None)).is_some());
        let longer = fits + "k";
        assert!(identity(1, &req("login", Some(&longer), None)).is_none());
        let fits_inline = "k".repeat(PAIR_BYTES - "login".len() - 2 - 16);
        assert!(identity(1, &req("login", Some(&fits_inline), Some([0; 16]))).is_some());
        assert!(identity(1, &req("login", Some(&(fits_inline + "k")), Some([0; 16]))).is_none());
    }
}
