//! The deny cache (Upstash's ephemeral cache, in shared memory): for a limit with
//! `deny_cache`, a consuming call that is denied for want of tokens leaves "(name, key) is
//! denied until T" in a slot of a direct-mapped table, and for at most `deny_cache` after it,
//! calls for that (name, key) are denied from the slot without reading the state.
//!
//! It only ever denies, and only what a real denial just found, so it cannot let anything
//! through; what it may do is deny a little longer than the state would: after tokens come
//! back early (a rollback of another transaction, `reset_rate_limit`, `define`, a direct
//! write to the tables), for at most the limit's `deny_cache`. `reset_rate_limit` and every
//! change to `rate_limiter.limits` or `rate_limiter.blocks` empty the whole table (a
//! generation number), as soon as they run.

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering::*};

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;

use crate::bucket::{Config, Reason};
use crate::clock;
use crate::hash;
use crate::limiter::{Decision, Request};
use crate::shmem;

/// `rate_limiter.deny_cache_slots`: slots of the table (rounded up to a power of two).
pub static SLOTS: GucSetting<i32> = GucSetting::<i32>::new(65536);

const SHMEM_NAME: &CStr = c"rate_limiter deny cache";

/// A slot's `tag` while a writer fills it; tags are odd, so never this.
const WRITING: u64 = 2;

#[repr(C)]
struct Header {
    /// A power of two.
    slots: u64,
    /// Slots written under an older generation are empty.
    generation: AtomicU64,
}

/// One cached denial; f64 fields are stored as bits, instants in the limiter's ms.
#[repr(C)]
struct Slot {
    /// The (name, key, inline) hash, odd; 0 for empty, `WRITING` while being filled.
    tag: AtomicU64,
    generation: AtomicU64,
    /// Until when the slot may answer.
    expires: AtomicU64,
    /// When the denied call could pass (its `retry_after` from then).
    retry_at: AtomicU64,
    remaining: AtomicU64,
    reset_at: AtomicU64,
}

static AREA: AtomicPtr<Header> = AtomicPtr::new(null_mut());

fn slot_count() -> u64 {
    match SLOTS.get() {
        0 => 0,
        n => (n as u64).next_power_of_two(),
    }
}

fn size(slots: u64) -> usize {
    size_of::<Header>().next_multiple_of(align_of::<Slot>()) + slots as usize * size_of::<Slot>()
}

/// The header and slots, when the library was preloaded with slots.
fn table() -> Option<(&'static Header, &'static [Slot])> {
    let header = AREA.load(Acquire);
    // SAFETY: set by `attach` to an area of `size(slots)` bytes that lives as long as the
    // server, laid out as a header and then the slots.
    unsafe {
        let header = header.as_ref()?;
        let first = header as *const Header as *const u8;
        let slots = first.add(size_of::<Header>().next_multiple_of(align_of::<Slot>())).cast::<Slot>();
        Some((header, std::slice::from_raw_parts(slots, header.slots as usize)))
    }
}

/// From `_PG_init`: the setting, only when preloading (a postmaster setting).
pub fn register(preloading: bool) {
    if preloading {
        GucRegistry::define_int_guc(
            c"rate_limiter.deny_cache_slots",
            c"Slots of the deny cache (limits with deny_cache); 0 turns it off.",
            c"Rounded up to a power of two; each slot takes 48 bytes of shared memory.",
            &SLOTS,
            0,
            1 << 24,
            GucContext::Postmaster,
            GucFlags::default(),
        );
    }
}

/// The postmaster's shmem request.
///
/// # Safety
/// Only from `shmem_request_hook`.
pub unsafe fn request() {
    if slot_count() > 0 {
        // SAFETY: the caller is the shmem request hook.
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
    let (area, found) = shmem::area(SHMEM_NAME, size(slots));
    if !found {
        // SAFETY: a new area of the requested size, all zeros (every slot empty).
        unsafe { area.cast::<Header>().write(Header { slots, generation: AtomicU64::new(1) }) };
    }
    AREA.store(area.cast::<Header>(), Release);
}

/// Empty the table: every slot written before now answers nothing.
pub fn forget_all() {
    if let Some((header, _)) = table() {
        header.generation.fetch_add(1, Release);
    }
}

/// The slot's tag of `req` in this database, odd. The table serves every database of the
/// cluster, and each has its own limits. Separators no name holds keep (name, key) pairs
/// from running into each other; inline configs keep rows apart from named ones, and so here.
fn tag(req: &Request<'_>) -> u64 {
    // SAFETY: a plain read of the backend's database, set before any SQL runs.
    let database = unsafe { pg_sys::MyDatabaseId }.to_u32().to_le_bytes();
    let key: [&[u8]; 2] = match req.key {
        Some(key) => [&[0xff], key.as_bytes()],
        None => [&[0xfe], &[]],
    };
    hash::of([&database[..], req.name.as_bytes(), key[0], key[1], &[u8::from(req.inline)]]) | 1
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
    let (header, slots) = table()?;
    let tag = tag(req);
    let slot = &slots[(tag >> 1) as usize & (slots.len() - 1)];
    if slot.tag.load(Acquire) != tag {
        return None;
    }
    let (generation, expires, retry_at) = (slot.generation.load(Relaxed), load(&slot.expires), load(&slot.retry_at));
    let (remaining, reset_at) = (load(&slot.remaining), load(&slot.reset_at));
    // Read again after the fields: a writer that came in between changed the tag.
    fence(Acquire);
    if slot.tag.load(Relaxed) != tag || generation != header.generation.load(Acquire) {
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
        reason: Some(Reason::Exhausted.as_str()),
        limited_by: Some(req.name.to_owned()),
    })
}

/// Keep `d` for `req` if it is a denial for want of tokens of a limit with a deny cache.
/// Skipped when another backend is writing the same slot: it is only a cache.
pub fn remember(req: &Request<'_>, config: &Config, d: &Decision) {
    let (Some(ttl), false, Some(retry_after)) = (config.deny_cache, d.ok, d.retry_after) else { return };
    if d.reason != Some(Reason::Exhausted.as_str()) || retry_after <= 0.0 {
        return;
    }
    let Some((header, slots)) = table() else { return };
    let tag = tag(req);
    let slot = &slots[(tag >> 1) as usize & (slots.len() - 1)];
    let before = slot.tag.load(Relaxed);
    if before == WRITING || slot.tag.compare_exchange(before, WRITING, Acquire, Relaxed).is_err() {
        return;
    }
    let now = clock::now_ms();
    slot.generation.store(header.generation.load(Acquire), Relaxed);
    store(&slot.expires, now + retry_after.min(ttl));
    store(&slot.retry_at, now + retry_after);
    store(&slot.remaining, d.remaining);
    store(&slot.reset_at, now + d.reset_after);
    slot.tag.store(tag, Release);
}
