//! What a backend's open transaction holds on the extension's behalf, kept until it ends: one
//! helper for every such list, with the server's transaction callbacks in one place.
//!
//! Each list (`Held`, by key, or `List`) tags what it is given with the subtransaction that
//! gave it. Subtransaction ids only rise, and a subtransaction started while another is open
//! is nested in it, so what a subtransaction and those nested in it gave is exactly what
//! carries its id or a later one: its abort takes that (`take_from`, or `forget`), and its
//! commit changes nothing. When the transaction ends, each list's owner is told (`Ending`),
//! once, by the callbacks `register` installs from `_PG_init`: a list is never left behind for
//! the next transaction. What an owner settles at a commit, an abort or a prepare is what its
//! lists hold, so a transaction that gave no list anything (nearly every transaction of a
//! server that preloads the library) tells no one of those; `Released` and a subtransaction's
//! abort are told as asked.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use pgrx::pg_sys;

pub use pg_sys::SubTransactionId;

/// How a transaction, or one of its subtransactions, ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ending {
    /// About to prepare (`PREPARE TRANSACTION`): an owner may still refuse, with an error.
    Preparing,
    /// Committed: durable and visible, its locks not yet released. An error here would come
    /// after the commit (a PANIC): an owner settles, it does not raise.
    Committed,
    /// Aborted, or prepared (what it held then belongs to the prepared transaction).
    Ended,
    /// A subtransaction aborted: what it and those nested in it gave.
    SubtransactionAborted(SubTransactionId),
    /// After `Committed` or `Ended`, once, in a transaction that asked for it
    /// (`tell_when_released`): its invalidations are sent (a session that takes them in from
    /// now on sees its catalog changes), and its locks are being released. As at `Committed`,
    /// an owner does not raise here.
    Released,
}

/// What a transaction holds of one kind, by key, each item with the subtransaction that gave
/// it; in the order given. For a `thread_local!` of an owner with nothing to settle, which
/// empties it on each `Ending` (`forget`).
pub struct Held<K, T> {
    by_key: RefCell<HashMap<K, Vec<(T, SubTransactionId)>>>,
}

/// How many keys' emptied lists a `Held` keeps, and how much room each list keeps, reused by
/// the next transaction: what one transaction made grow beyond that goes with it.
const KEPT_KEYS: usize = 16;
const KEPT_ITEMS: usize = 64;

impl<K: Eq + Hash, T> Default for Held<K, T> {
    fn default() -> Self {
        Held { by_key: RefCell::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash, T> Held<K, T> {
    /// `item` held under `key` until the transaction, or the current subtransaction if it
    /// aborts, ends.
    pub fn add(&self, key: K, item: T) {
        let sub = current_subtransaction();
        self.by_key.borrow_mut().entry(key).or_default().push((item, sub));
        GIVEN.store(true, Relaxed);
    }

    /// What `key` holds, oldest first.
    pub fn copied(&self, key: &K) -> Vec<T>
    where
        T: Copy,
    {
        self.by_key.borrow().get(key).map_or_else(Vec::new, |items| items.iter().map(|(item, _)| *item).collect())
    }

    /// The items `key` holds, oldest first, each with the subtransaction that gave it, for
    /// `with` to read or change in place.
    pub fn with_items<R>(&self, key: &K, with: impl FnOnce(&mut [(T, SubTransactionId)]) -> R) -> R {
        let mut by_key = self.by_key.borrow_mut();
        with(by_key.get_mut(key).map_or(&mut [][..], Vec::as_mut_slice))
    }

    /// Emptied as `ending` asks. The lists keep their room for the next transaction, unless
    /// there are many of them.
    pub fn forget(&self, ending: Ending) {
        let mut by_key = self.by_key.borrow_mut();
        if by_key.is_empty() {
            return;
        }
        match ending {
            Ending::Committed | Ending::Ended if by_key.len() > KEPT_KEYS => *by_key = HashMap::new(),
            Ending::Committed | Ending::Ended => by_key.values_mut().for_each(|items| {
                items.clear();
                items.shrink_to(KEPT_ITEMS);
            }),
            Ending::SubtransactionAborted(ending) => by_key.retain(|_, items| {
                items.retain(|(_, sub)| *sub < ending);
                !items.is_empty()
            }),
            Ending::Preparing | Ending::Released => {}
        }
    }
}

/// What a transaction holds of one kind, unkeyed, each item with the subtransaction that gave
/// it; in the order given. For a `thread_local!` of an owner that settles what it holds when
/// the transaction or a subtransaction ends (`take`, `take_from`). A list rather than a
/// `Held` of one key: it is on the path of every call, where a map hashes its key at each use.
pub struct List<T> {
    items: RefCell<Vec<(T, SubTransactionId)>>,
}

impl<T> Default for List<T> {
    fn default() -> Self {
        List { items: RefCell::new(Vec::new()) }
    }
}

impl<T> List<T> {
    /// `item` held until the transaction, or the current subtransaction if it aborts, ends.
    pub fn add(&self, item: T) {
        let sub = current_subtransaction();
        self.items.borrow_mut().push((item, sub));
        GIVEN.store(true, Relaxed);
    }

    /// The items, oldest first, each with the subtransaction that gave it, for `with` to read
    /// or change in place.
    pub fn with_items<R>(&self, with: impl FnOnce(&mut [(T, SubTransactionId)]) -> R) -> R {
        with(self.items.borrow_mut().as_mut_slice())
    }

    /// Whether any item satisfies `hit`.
    pub fn any(&self, hit: impl Fn(&T) -> bool) -> bool {
        self.items.borrow().iter().any(|(item, _)| hit(item))
    }

    /// How many items it holds: a mark for `take_after`.
    pub fn count(&self) -> usize {
        self.items.borrow().len()
    }

    /// The items given after `mark` items, taken out.
    pub fn take_after(&self, mark: usize) -> Vec<T> {
        let mut items = self.items.borrow_mut();
        let mark = mark.min(items.len());
        items.drain(mark..).map(|(item, _)| item).collect()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.items.borrow().is_empty()
    }

    /// Everything held, taken out, oldest first. The list keeps its room for the next
    /// transaction, up to `KEPT_ITEMS`.
    pub fn take(&self) -> Vec<T> {
        let mut items = self.items.borrow_mut();
        if items.is_empty() {
            return Vec::new();
        }
        let taken = items.drain(..).map(|(item, _)| item).collect();
        items.shrink_to(KEPT_ITEMS);
        taken
    }

    /// What subtransaction `ending` and those nested in it gave, taken out.
    pub fn take_from(&self, ending: SubTransactionId) -> Vec<T> {
        self.items.borrow_mut().extract_if(.., |(_, sub)| *sub >= ending).map(|(item, _)| item).collect()
    }
}

/// The current subtransaction's id.
pub fn current_subtransaction() -> SubTransactionId {
    crate::unguarded::current_subtransaction()
}

/// Who is told of each `Ending`: the owners of the lists, in this order.
type Owner = fn(Ending);

thread_local! {
    static OWNERS: Cell<&'static [Owner]> = const { Cell::new(&[]) };
}

// Plain statics rather than thread-locals (a backend is one thread), read on every release of
// every resource owner: whether this transaction asked to be told `Released`, and whether it
// ended and that is still to be told.
static RELEASE_WANTED: AtomicBool = AtomicBool::new(false);
static RELEASE_PENDING: AtomicBool = AtomicBool::new(false);
/// Whether a list may hold anything: raised by every `add`, lowered once the owners were told
/// `Committed` or `Ended` and emptied their lists. While it is down every list is empty, and a
/// transaction's end has nothing to tell them (nearly every transaction of a server that
/// preloads the library makes no call of it).
static GIVEN: AtomicBool = AtomicBool::new(false);
/// Whether this process registered `at_release`: at the first ask, so that a backend that
/// never asks pays nothing on its releases.
static RELEASE_REGISTERED: AtomicBool = AtomicBool::new(false);

/// Have the owners told `Released` when this transaction ends.
pub fn tell_when_released() {
    if !RELEASE_REGISTERED.load(Relaxed) {
        // SAFETY: a callback that lives as long as the library, registered once per process
        // (marked once registered: an out-of-memory error here leaves it to the next ask).
        unsafe { pg_sys::RegisterResourceReleaseCallback(Some(at_release), std::ptr::null_mut()) };
        RELEASE_REGISTERED.store(true, Relaxed);
    }
    RELEASE_WANTED.store(true, Relaxed);
}

/// From `_PG_init`, once per process (children of a preloading postmaster inherit it): the
/// owners of the lists, and the server's callbacks that tell them.
pub fn register(owners: &'static [Owner]) {
    if OWNERS.get().is_empty() {
        OWNERS.set(owners);
        // SAFETY: callbacks that live as long as the library, registered once per process
        // (OWNERS is empty only before the first registration).
        unsafe {
            pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
        }
    }
}

fn tell(ending: Ending) {
    for owner in OWNERS.get() {
        owner(ending);
    }
}

/// What transaction event `event` tells the owners, if anything.
fn ending_of(event: pg_sys::XactEvent::Type) -> Option<Ending> {
    use pg_sys::XactEvent::*;
    // A parallel worker's own events too: it holds nothing (every function of the extension
    // that holds anything is parallel unsafe or restricted), and its lists end empty.
    match event {
        XACT_EVENT_PRE_PREPARE => Some(Ending::Preparing),
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT => Some(Ending::Committed),
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT | XACT_EVENT_PREPARE => Some(Ending::Ended),
        _ => None,
    }
}

/// # Safety
/// Only as a transaction callback, registered by `register`.
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    // Called at every transaction's end, so it is not guarded (pgrx's guard costs a hundred
    // instructions) until there is something to tell: atomics that cannot raise or panic.
    let Some(ending) = ending_of(event) else { return };
    // Raised, never lowered here: a commit whose later callbacks raise ends in an abort, which
    // must not take back the `Released` the commit asked for (only `tell_released` lowers it).
    if ending != Ending::Preparing && RELEASE_WANTED.swap(false, Relaxed) {
        RELEASE_PENDING.store(true, Relaxed);
    }
    // What the owners settle, refuse or forget here is what their lists hold: with all of
    // them empty there is nothing to tell.
    if GIVEN.load(Relaxed) {
        // SAFETY: called from a transaction callback, as its contract asks.
        unsafe { tell_ended(event) }
    }
}

/// # Safety
/// Only from `at_transaction_end`, with an event `ending_of` maps.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn tell_ended(event: pg_sys::XactEvent::Type) {
    let Some(ending) = ending_of(event) else { return };
    tell(ending);
    // Once every owner emptied its lists (an owner adds nothing while told; one that raised
    // leaves the flag up, so the next end tells them again).
    if ending != Ending::Preparing {
        GIVEN.store(false, Relaxed);
    }
}

/// # Safety
/// Only as a resource release callback, registered by `register`.
unsafe extern "C-unwind" fn at_release(phase: pg_sys::ResourceReleasePhase::Type, _commit: bool, top_level: bool, _arg: *mut c_void) {
    // The server sends a transaction's invalidations (AtEOXact_Inval, or PostPrepare_Inval)
    // between the phases before and of the locks; the top-level owner's tree is released
    // phase by phase, with this called for each owner in it: told once, at the first. Called
    // for every phase of every owner of every transaction, so it is not guarded (pgrx's guard
    // costs a hundred instructions) until there is something to tell: a test that cannot
    // raise or panic.
    if phase == pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_LOCKS && top_level && RELEASE_PENDING.load(Relaxed) {
        // SAFETY: called from a resource release callback, as its contract asks.
        unsafe { tell_released() }
    }
}

/// # Safety
/// Only from `at_release`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn tell_released() {
    RELEASE_PENDING.store(false, Relaxed);
    tell(Ending::Released);
}

/// # Safety
/// Only as a subtransaction callback, registered by `register`.
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    ending: SubTransactionId,
    _parent: SubTransactionId,
    _arg: *mut c_void,
) {
    // Called at each savepoint's start, commit and release too, which tell nothing: guarded
    // only for an abort (a comparison cannot raise or panic).
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        // SAFETY: called from a subtransaction callback, as its contract asks.
        unsafe { tell_subtransaction_aborted(ending) }
    }
}

/// # Safety
/// Only from `at_subtransaction_end`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn tell_subtransaction_aborted(ending: SubTransactionId) {
    tell(Ending::SubtransactionAborted(ending));
}
