//! The extension writes its tables with more rights than its caller: its owner's, a
//! superuser's, in SECURITY DEFINER functions, in `spi::write` and in the workers. A trigger
//! or rule on such a table runs with the writer's rights, so one that a role with TRIGGER on
//! the table planted would run as a superuser. Before each such write the table is locked
//! against new triggers (ROW EXCLUSIVE conflicts with CREATE TRIGGER and CREATE RULE) and
//! refused (55000) if it has a trigger or rule the extension did not create.

use std::ffi::CStr;

use pgrx::pg_sys;

use crate::cache;
use crate::error::Error;

/// Lock `table` for writing, to the end of the transaction, and refuse it if it has a
/// trigger whose function is not the extension's, or a rule.
pub fn writable(table: pg_sys::Oid) {
    // Opened with the lock a write takes (kept by table_close(NoLock) to the transaction's end).
    let relation = super::open_table(table, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE, "a table of rate_limiter");
    // SAFETY: the relation is open; its descriptor is read while it is.
    unsafe {
        let planted = planted_code(relation);
        pg_sys::table_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
        if let Some(what) = planted {
            Error::PlantedCode { table: cache::qualified_name(table), what }.raise()
        }
    }
}

/// The first trigger of `relation` the extension did not make (`is_own`), or its first rule,
/// as `trigger "name"`.
///
/// # Safety
/// `relation` is open.
unsafe fn planted_code(relation: pg_sys::Relation) -> Option<String> {
    // Copied before any catalog lookup: a lookup may take invalidations that rebuild the
    // relation's entry and free its trigger descriptor (as the executor copies it too).
    // SAFETY: the caller's relation is open: its trigger descriptor is null or holds
    // `numtriggers` triggers, each with a NUL-terminated name; its rule lock null or
    // `numLocks` rules.
    let (table, triggers, rule) = unsafe {
        let table = CStr::from_ptr((*(*relation).rd_rel).relname.data.as_ptr()).to_string_lossy().into_owned();
        let descriptor = (*relation).trigdesc;
        let triggers: Vec<Trigger> = if descriptor.is_null() {
            Vec::new()
        } else {
            (0..(*descriptor).numtriggers as usize).map(|i| Trigger::of(&*(*descriptor).triggers.add(i))).collect()
        };
        let rules = (*relation).rd_rules;
        let rule = (!rules.is_null() && (*rules).numLocks > 0).then(|| (**(*rules).rules).ruleId.to_u32());
        (table, triggers, rule)
    };
    if !triggers.is_empty() {
        // SAFETY: a catalog lookup by name inside the caller's transaction.
        let extension = unsafe { pg_sys::get_extension_oid(c"rate_limiter".as_ptr(), false) };
        if let Some(planted) = triggers.iter().find(|trigger| !trigger.is_own(&table, extension)) {
            return Some(format!("trigger \"{}\"", planted.name));
        }
    }
    rule.map(|oid| format!("a rule (pg_rewrite oid {oid})"))
}

/// What `is_own` reads of a trigger, copied out of the relation's descriptor.
struct Trigger {
    name: String,
    kind: i16,
    internal: bool,
    has_when: bool,
    arguments: i16,
    function: pg_sys::Oid,
}

impl Trigger {
    /// # Safety
    /// `trigger` is a trigger of an open relation's descriptor.
    unsafe fn of(trigger: &pg_sys::Trigger) -> Trigger {
        Trigger {
            // SAFETY: the trigger's name is a NUL-terminated string of the descriptor.
            name: unsafe { CStr::from_ptr(trigger.tgname) }.to_string_lossy().into_owned(),
            kind: trigger.tgtype,
            internal: trigger.tgisinternal,
            has_when: !trigger.tgqual.is_null(),
            arguments: trigger.tgnargs,
            function: trigger.tgfoid,
        }
    }

    /// Whether it is a trigger the extension made on `table` (sql/finalize.sql):
    /// `<table>_changed`, AFTER INSERT OR UPDATE OR DELETE of each row, or `<table>_truncated`,
    /// AFTER TRUNCATE, each running the extension's own function with no WHEN and no
    /// arguments. The function alone would not do: a planted trigger may run it BEFORE each
    /// row (which skips the row) or with a WHEN clause of the planter's (which runs with the
    /// writer's rights).
    fn is_own(&self, table: &str, extension: pg_sys::Oid) -> bool {
        let shape = (self.name == format!("{table}_changed") && self.kind == ROW | INSERT | DELETE | UPDATE)
            || (self.name == format!("{table}_truncated") && self.kind == TRUNCATE);
        shape
            && !self.internal
            && !self.has_when
            && self.arguments == 0
            // SAFETY: a catalog lookup by OID inside the caller's transaction.
            && unsafe { pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, self.function) } == extension
    }
}

// pg_trigger.tgtype's bits (catalog/pg_trigger.h).
const ROW: i16 = 1 << 0;
const INSERT: i16 = 1 << 2;
const DELETE: i16 = 1 << 3;
const UPDATE: i16 = 1 << 4;
const TRUNCATE: i16 = 1 << 5;
