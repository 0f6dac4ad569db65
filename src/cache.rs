//! Per-backend caches: the OIDs of the extension's tables, indexes and row type, the
//! configs of named limits, whether any block, allow or override exists, and the overrides of
//! the keys called. A relcache invalidation of one of those relations empties them.
//! PostgreSQL sends one on DDL and DROP EXTENSION, and the triggers on `rate_limiter.limits`,
//! `blocks`, `allows`, `overrides` and `tiers` send one at every change to them, delivered to each
//! backend once the change commits.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::ptr::null_mut;

use pgrx::prelude::*;

use crate::bucket::Config;
use crate::error::Error;

#[derive(Clone, Copy)]
pub struct Relations {
    pub state: pg_sys::Oid,
    pub state_key: pg_sys::Oid,
    pub limits: pg_sys::Oid,
    pub limits_key: pg_sys::Oid,
    pub blocks: pg_sys::Oid,
    pub blocks_key: pg_sys::Oid,
    /// `rate_limiter.allows` and its unique index; None in a database whose extension is
    /// older than 0.4.0 (not yet updated to this library): it has no allow list.
    pub allows: Option<(pg_sys::Oid, pg_sys::Oid)>,
    /// `rate_limiter.debits` (the log of hot limits) and its primary key; None in a database
    /// whose extension is older than 0.4.0: it has no hot limits.
    pub debits: Option<(pg_sys::Oid, pg_sys::Oid)>,
    /// The log's index by (name, key, seq); None in a database whose extension is older than
    /// 0.5.0: its hot calls wait for the update.
    pub debits_key: Option<pg_sys::Oid>,
    /// `rate_limiter.leases`, the leases of concurrency limits; None in a database whose
    /// extension is older than 0.5.0.
    pub leases: Option<pg_sys::Oid>,
    /// `rate_limiter.overrides` and its unique index; None in a database whose extension is
    /// older than 0.7.0: no key has numbers of its own.
    pub overrides: Option<(pg_sys::Oid, pg_sys::Oid)>,
    /// `rate_limiter.tiers` and its primary key; None where `overrides` is.
    pub tiers: Option<(pg_sys::Oid, pg_sys::Oid)>,
    /// `rate_limiter.memory_snapshot`, memory limits' counts as the worker last wrote them;
    /// None in a database whose extension is older than 0.7.0 (0.6.0 kept a row per key): no
    /// snapshot is written or loaded there.
    pub memory_snapshot: Option<pg_sys::Oid>,
    /// The table of that name, of whatever version: watched, so that the update that makes it
    /// anew is seen.
    snapshot_table: pg_sys::Oid,
    pub decision_type: pg_sys::Oid,
    decision: pg_sys::Oid,
}

/// The two lists of keys looked up before any state: denied, and never limited.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum List {
    Blocks,
    Allows,
}

thread_local! {
    static RELATIONS: Cell<Option<Relations>> = const { Cell::new(None) };
    /// How many times the caches were emptied: what is cached elsewhere from the same
    /// relations (`storage::decision_type`) is current while this has not moved.
    static GENERATION: Cell<u64> = const { Cell::new(0) };
    static CONFIGS: RefCell<HashMap<String, Config>> = RefCell::new(HashMap::new());
    /// The last name `config` answered and its config: a backend calls one limit again and
    /// again, and a comparison of the name costs less than its hash. Emptied with `CONFIGS`.
    static LAST_CONFIG: RefCell<(String, Option<Config>)> = const { RefCell::new((String::new(), None)) };
    static ANY_BLOCKS: Cell<Option<bool>> = const { Cell::new(None) };
    static ANY_ALLOWS: Cell<Option<bool>> = const { Cell::new(None) };
    static ANY_OVERRIDES: Cell<Option<bool>> = const { Cell::new(None) };
    static OVERRIDDEN: RefCell<HashMap<Pair, Option<Overridden>>> = RefCell::new(HashMap::new());
    static OVERRIDDEN_KEYS: RefCell<KeysOfLimits> = RefCell::new(KeysOfLimits::default());
}

/// The keys each limit called in this backend overrides: a key not among them is answered
/// without a probe of the table. None for a limit with more than fit: its keys are probed.
#[derive(Default)]
struct KeysOfLimits {
    limits: HashMap<String, Option<Keys>>,
    bytes: usize,
}

#[derive(Default)]
struct Keys {
    keys: HashSet<String>,
    null: bool,
}

/// The most bytes of overridden keys a backend keeps (a key's length and 32 for its entry):
/// a limit with more falls back to a probe per key, as when the budget is spent on others.
const MAX_OVERRIDDEN_KEY_BYTES: usize = 1 << 20;

/// A (name, key) whose override, or lack of one, a backend keeps.
type Pair = (String, Option<String>);

/// What a key's override makes of its named limit: the config it is decided under, whether
/// it is exempt, and until when (ms).
#[derive(Clone, Copy, Debug)]
pub struct Overridden {
    pub config: Config,
    pub exempt: bool,
    pub until: f64,
}

/// The most (name, key) pairs whose override, or lack of one, a backend keeps: a backend
/// that calls more keys than this looks the others up again.
const MAX_OVERRIDDEN: usize = 10_000;

/// The caches' generation: it moves whenever they are emptied.
pub fn generation() -> u64 {
    GENERATION.get()
}

pub fn relations() -> Relations {
    RELATIONS.get().unwrap_or_else(|| {
        let found = look_up();
        RELATIONS.set(Some(found));
        found
    })
}

/// The extension's relations, found through what the extension owns rather than by name:
/// the schema is `pg_extension.extnamespace`, every relation must be a member of the
/// extension (its indexes belong to its tables), and the schema and tables must be owned by
/// the extension's owner or a superuser. A role that could replace or rename them could
/// otherwise make this code read and write look-alikes, or run its own operators.
fn look_up() -> Relations {
    // SAFETY: reached only through `relations()`, which runs inside a transaction (SQL calls,
    // the worker's transactions), as catalog lookups and `extension_row` require; the lookups
    // raise an ERROR or return InvalidOid, which is checked, never a dangling pointer.
    unsafe {
        let extension = pg_sys::get_extension_oid(c"rate_limiter".as_ptr(), false);
        let (schema, owner) = extension_row(extension);
        trusted_owner(namespace_owner(schema), owner, || format!("schema {}", schema_name(schema)));
        let member = |name: &CStr, class: pg_sys::Oid, oid: pg_sys::Oid| {
            if pg_sys::getExtensionOfObject(class, oid) != extension {
                Error::NotAMember(format!("{}.{}", schema_name(schema), name.to_string_lossy())).raise()
            }
        };
        let relation = |name: &CStr| {
            let oid = pg_sys::get_relname_relid(name.as_ptr(), schema);
            if oid == pg_sys::InvalidOid {
                Error::RelationGone(format!("{}.{}", schema_name(schema), name.to_string_lossy())).raise()
            }
            oid
        };
        let table = |name: &CStr| {
            let oid = relation(name);
            member(name, pg_sys::RelationRelationId, oid);
            trusted_owner(relation_owner(oid), owner, || format!("table {}", qualified_name(oid)));
            oid
        };
        let index_of = |table: pg_sys::Oid, name: &CStr| {
            let oid = relation(name);
            if pg_sys::IndexGetRelation(oid, true) != table {
                Error::NotAMember(format!("{}.{}", schema_name(schema), name.to_string_lossy())).raise()
            }
            oid
        };
        let decision = relation(c"decision");
        let decision_type = pg_sys::get_rel_type_id(decision);
        member(c"decision", pg_sys::TypeRelationId, decision_type);
        let state = table(c"state");
        // The library can be newer than the extension's SQL in a database not yet updated:
        // 0.1.0 and 0.2.0 had no expires column.
        if pg_sys::get_attnum(state, c"expires".as_ptr()) == pg_sys::InvalidAttrNumber as i16 {
            Error::ExtensionOutdated.raise()
        }
        let (limits, blocks) = (table(c"limits"), table(c"blocks"));
        let allows = (pg_sys::get_relname_relid(c"allows".as_ptr(), schema) != pg_sys::InvalidOid).then(|| {
            let allows = table(c"allows");
            (allows, index_of(allows, c"allows_key_name_key"))
        });
        let debits = (pg_sys::get_relname_relid(c"debits".as_ptr(), schema) != pg_sys::InvalidOid).then(|| {
            let debits = table(c"debits");
            (debits, index_of(debits, c"debits_pkey"))
        });
        let debits_key = debits
            .filter(|_| pg_sys::get_relname_relid(c"debits_key".as_ptr(), schema) != pg_sys::InvalidOid)
            .map(|(debits, _)| index_of(debits, c"debits_key"));
        let overrides = (pg_sys::get_relname_relid(c"overrides".as_ptr(), schema) != pg_sys::InvalidOid).then(|| {
            let overrides = table(c"overrides");
            (overrides, index_of(overrides, c"overrides_name_key_key"))
        });
        let tiers = overrides.and_then(|_| {
            (pg_sys::get_relname_relid(c"tiers".as_ptr(), schema) != pg_sys::InvalidOid).then(|| {
                let tiers = table(c"tiers");
                (tiers, index_of(tiers, c"tiers_pkey"))
            })
        });
        let leases = (pg_sys::get_relname_relid(c"leases".as_ptr(), schema) != pg_sys::InvalidOid).then(|| table(c"leases"));
        // 0.6.0's table (a row per key) until the update to 0.7.0 makes it a log: no snapshot,
        // but its drop by the update is watched (`forget`).
        let snapshot_table =
            (pg_sys::get_relname_relid(c"memory_snapshot".as_ptr(), schema) != pg_sys::InvalidOid).then(|| table(c"memory_snapshot"));
        let memory_snapshot = snapshot_table.filter(|t| pg_sys::get_attnum(*t, c"kind".as_ptr()) != pg_sys::InvalidAttrNumber as i16);
        Relations {
            state,
            state_key: index_of(state, c"state_key_name_shard_key"),
            limits,
            limits_key: index_of(limits, c"limits_pkey"),
            blocks,
            blocks_key: index_of(blocks, c"blocks_key_name_key"),
            allows,
            debits,
            debits_key,
            leases,
            overrides,
            tiers,
            memory_snapshot,
            snapshot_table: snapshot_table.unwrap_or(pg_sys::InvalidOid),
            decision_type,
            decision,
        }
    }
}

/// The schema and owner of the extension `extension`, from its pg_extension row.
///
/// # Safety
/// Inside a transaction.
unsafe fn extension_row(extension: pg_sys::Oid) -> (pg_sys::Oid, pg_sys::Oid) {
    // SAFETY: the caller guarantees a transaction, which table_open and the catalog scan need;
    // the tuple is checked non-null before GETSTRUCT and read before the scan ends, as
    // PostgreSQL's own get_extension_* functions do.
    unsafe {
        let catalog = pg_sys::table_open(pg_sys::ExtensionRelationId, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let mut key = pg_sys::ScanKeyData::default();
        pg_sys::ScanKeyInit(
            &mut key,
            pg_sys::Anum_pg_extension_oid as pg_sys::AttrNumber,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::F_OIDEQ.into(),
            extension.into(),
        );
        let scan = pg_sys::systable_beginscan(catalog, pg_sys::ExtensionOidIndexId.into(), true, null_mut(), 1, &mut key);
        let tuple = pg_sys::systable_getnext(scan);
        if tuple.is_null() {
            Error::RelationGone("extension rate_limiter".to_owned()).raise()
        }
        let row = &*(pg_sys::GETSTRUCT(tuple) as *const pg_sys::FormData_pg_extension);
        let found = (row.extnamespace, row.extowner);
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(catalog, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        found
    }
}

/// The owner column of the syscache row of `oid` in `cache`, read as the catalog form `F`.
///
/// # Safety
/// `F` is the form of `cache`'s catalog, and `owner` reads a field of it.
unsafe fn syscache_owner<F>(cache: pg_sys::SysCacheIdentifier::Type, oid: pg_sys::Oid, owner: fn(&F) -> pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: NULL is checked before GETSTRUCT; the caller guarantees `F` is the catalog's
    // form, so the cast matches the row, which stays pinned until ReleaseSysCache below.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(cache as i32, oid.into());
        if tuple.is_null() {
            error!("cache lookup failed for object {}", oid.to_u32());
        }
        let found = owner(&*(pg_sys::GETSTRUCT(tuple) as *const F));
        pg_sys::ReleaseSysCache(tuple);
        found
    }
}

fn namespace_owner(schema: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: NAMESPACEOID rows are pg_namespace forms.
    unsafe { syscache_owner(pg_sys::SysCacheIdentifier::NAMESPACEOID, schema, |n: &pg_sys::FormData_pg_namespace| n.nspowner) }
}

/// The owner of one of the extension's relations (checked trusted when it was found).
pub fn owner(relation: pg_sys::Oid) -> pg_sys::Oid {
    relation_owner(relation)
}

fn relation_owner(relation: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: RELOID rows are pg_class forms.
    unsafe { syscache_owner(pg_sys::SysCacheIdentifier::RELOID, relation, |c: &pg_sys::FormData_pg_class| c.relowner) }
}

fn schema_name(schema: pg_sys::Oid) -> String {
    // SAFETY: get_namespace_name takes any OID and returns NULL for a missing schema (handled
    // below); it runs only in `look_up`'s transaction, where syscache lookups are allowed.
    let name = unsafe { pg_sys::get_namespace_name(schema) };
    if name.is_null() {
        return format!("schema {}", schema.to_u32());
    }
    // SAFETY: `name` is non-null (checked above), and get_namespace_name returns a
    // NUL-terminated palloc'd copy, live until this memory context is reset.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// Refuse an object of the extension (`what`, for the message) owned by a role that neither
/// owns the extension nor is a superuser: such a role could drop, replace or rename what this
/// code trusts.
fn trusted_owner(object_owner: pg_sys::Oid, extension_owner: pg_sys::Oid, what: impl FnOnce() -> String) {
    // SAFETY: superuser_arg takes any role OID (a missing role is no superuser) and only reads
    // the syscache, inside `look_up`'s transaction.
    if object_owner == extension_owner || unsafe { pg_sys::superuser_arg(object_owner) } {
        return;
    }
    // SAFETY: with missing_ok, GetUserNameFromId returns NULL for an unknown role instead of
    // raising (handled below); it reads the syscache inside `look_up`'s transaction.
    let role = unsafe { pg_sys::GetUserNameFromId(object_owner, true) };
    let role = if role.is_null() {
        object_owner.to_u32().to_string()
    } else {
        // SAFETY: `role` is non-null here, and GetUserNameFromId returns a NUL-terminated
        // palloc'd copy, live until this memory context is reset.
        unsafe { CStr::from_ptr(role) }.to_string_lossy().into_owned()
    };
    Error::UntrustedOwner { what: what(), role }.raise()
}

/// `schema.relation` of a relation, each part quoted as needed: SQL that names the
/// extension's tables is built from their OIDs, never from a name someone could shadow.
pub fn qualified_name(relation: pg_sys::Oid) -> String {
    // SAFETY: in a transaction (callers are SQL calls and the worker's), each lookup takes any
    // OID and gives NULL for a missing relation, checked before quote_qualified_identifier
    // reads the names; it returns a NUL-terminated palloc'd string.
    unsafe {
        let schema = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relation));
        let name = pg_sys::get_rel_name(relation);
        if schema.is_null() || name.is_null() {
            Error::RelationGone(format!("relation {}", relation.to_u32())).raise()
        }
        CStr::from_ptr(pg_sys::quote_qualified_identifier(schema, name)).to_string_lossy().into_owned()
    }
}

/// The named limit's config, from the cache or from `load` (which the cache then keeps).
pub fn config<E>(name: &str, load: impl FnOnce() -> Result<Config, E>) -> Result<Config, E> {
    if let Some(config) = LAST_CONFIG.with_borrow(|(last, config)| config.filter(|_| last == name)) {
        return Ok(config);
    }
    let config = match CONFIGS.with_borrow(|configs| configs.get(name).copied()) {
        Some(config) => config,
        None => {
            let config = load()?;
            CONFIGS.with_borrow_mut(|configs| configs.insert(name.to_owned(), config));
            config
        }
    };
    LAST_CONFIG.with_borrow_mut(|(last, last_config)| {
        last.clear();
        last.push_str(name);
        *last_config = Some(config);
    });
    Ok(config)
}

/// Whether `rate_limiter.overrides` has any row, from the cache or from `load`.
pub fn any_override(load: impl FnOnce() -> bool) -> bool {
    flag(&ANY_OVERRIDES, load)
}

/// The override of `name`'s `key` (`None`: it has none), from the cache or from `load`.
pub fn overridden<E>(name: &str, key: Option<&str>, load: impl FnOnce() -> Result<Option<Overridden>, E>) -> Result<Option<Overridden>, E> {
    let pair = (name.to_owned(), key.map(str::to_owned));
    if let Some(found) = OVERRIDDEN.with_borrow(|known| known.get(&pair).copied()) {
        return Ok(found);
    }
    let found = load()?;
    OVERRIDDEN.with_borrow_mut(|known| {
        if known.len() >= MAX_OVERRIDDEN {
            known.clear();
        }
        known.insert(pair, found);
    });
    Ok(found)
}

/// Whether `name`'s `key` may have an override: false when it is not among the limit's
/// overridden keys, from the cache or from `load` (`load(most)`: None when there are more
/// than `most`).
pub fn may_be_overridden(name: &str, key: Option<&str>, load: impl FnOnce(usize) -> Option<Vec<Option<String>>>) -> bool {
    let known = OVERRIDDEN_KEYS.with_borrow(|kept| {
        kept.limits.get(name).map(|keys| keys.as_ref().is_none_or(|k| key.map_or(k.null, |key| k.keys.contains(key))))
    });
    if let Some(known) = known {
        return known;
    }
    let cost = |key: &Option<String>| key.as_ref().map_or(0, String::len) + 32;
    let loaded = load(MAX_OVERRIDDEN_KEY_BYTES / 32);
    let key_bytes = loaded.as_ref().map_or(0, |keys| keys.iter().map(cost).sum::<usize>());
    let found = loaded.filter(|_| key_bytes <= MAX_OVERRIDDEN_KEY_BYTES);
    let bytes = (if found.is_some() { key_bytes } else { 0 }) + name.len() + 32;
    let answer = found.as_ref().is_none_or(|keys| keys.iter().any(|k| k.as_deref() == key));
    OVERRIDDEN_KEYS.with_borrow_mut(|kept| {
        if kept.bytes + bytes > MAX_OVERRIDDEN_KEY_BYTES {
            *kept = KeysOfLimits::default();
        }
        kept.bytes += bytes;
        let keys = found.map(|keys| {
            let null = keys.contains(&None);
            Keys { keys: keys.into_iter().flatten().collect(), null }
        });
        kept.limits.insert(name.to_owned(), keys);
    });
    answer
}

/// Whether `list` has any row, from the cache or from `load`.
pub fn any_listed(list: List, load: impl FnOnce() -> bool) -> bool {
    flag(
        match list {
            List::Blocks => &ANY_BLOCKS,
            List::Allows => &ANY_ALLOWS,
        },
        load,
    )
}

/// A per-backend flag, from the cache or from `load` (which the cache then keeps).
fn flag(flag: &'static std::thread::LocalKey<Cell<Option<bool>>>, load: impl FnOnce() -> bool) -> bool {
    flag.get().unwrap_or_else(|| {
        let any = load();
        flag.set(Some(any));
        any
    })
}

/// The relcache invalidation callback: forgets this backend's caches when one of the
/// extension's relations (or everything) is invalidated. Reads nothing through pointers.
///
/// # Safety
/// None: it ignores `_arg` and dereferences nothing, so any call is sound.
#[pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let ours = match RELATIONS.get() {
        Some(r) => {
            let (allows, allows_key) = r.allows.unwrap_or((pg_sys::InvalidOid, pg_sys::InvalidOid));
            let (debits, debits_key) = r.debits.unwrap_or((pg_sys::InvalidOid, pg_sys::InvalidOid));
            let by_key = r.debits_key.unwrap_or(pg_sys::InvalidOid);
            let leases = r.leases.unwrap_or(pg_sys::InvalidOid);
            let (overrides, overrides_key) = r.overrides.unwrap_or((pg_sys::InvalidOid, pg_sys::InvalidOid));
            let (tiers, tiers_key) = r.tiers.unwrap_or((pg_sys::InvalidOid, pg_sys::InvalidOid));
            [
                r.state, r.state_key, r.limits, r.limits_key, r.blocks, r.blocks_key, allows, allows_key, debits, debits_key, by_key,
                leases, overrides, overrides_key, tiers, tiers_key, r.snapshot_table, r.decision,
            ]
            .contains(&relid)
        }
        None => true,
    };
    if relid == pg_sys::InvalidOid || ours {
        GENERATION.set(GENERATION.get().wrapping_add(1));
        RELATIONS.set(None);
        CONFIGS.with_borrow_mut(HashMap::clear);
        LAST_CONFIG.with_borrow_mut(|(_, config)| *config = None);
        ANY_BLOCKS.set(None);
        ANY_ALLOWS.set(None);
        ANY_OVERRIDES.set(None);
        OVERRIDDEN.with_borrow_mut(HashMap::clear);
        OVERRIDDEN_KEYS.set(KeysOfLimits::default());
    }
}

/// The syscache callback for pg_namespace: a schema renamed or given to another owner may
/// be the extension's, whose relations were checked against its owner.
///
/// # Safety
/// None: it dereferences nothing, as `forget`.
#[pg_guard]
unsafe extern "C-unwind" fn forget_on_schema_change(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    // SAFETY: as `forget` for every relation; reads nothing through pointers.
    unsafe { forget(pg_sys::Datum::from(0), pg_sys::InvalidOid) }
}

/// Called once from `_PG_init`.
pub fn register_invalidation() {
    // SAFETY: the callbacks are static functions, valid for the process's life, and this runs
    // once per process (from `_PG_init`), so PostgreSQL's fixed-size callback tables never
    // fill up with repeats.
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(forget), pg_sys::Datum::from(0));
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as i32,
            Some(forget_on_schema_change),
            pg_sys::Datum::from(0),
        );
    }
}
