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
    // SAFETY: inside a transaction; the relation is opened with the lock a write takes (kept
    // by table_close(NoLock) to the transaction's end) and its descriptor is read while open.
    unsafe {
        let relation = pg_sys::table_open(table, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
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
    // SAFETY: the caller's relation is open: its trigger descriptor is null or holds
    // `numtriggers` triggers, its rule lock null or `numLocks` rules.
    unsafe {
        let triggers = (*relation).trigdesc;
        if !triggers.is_null() {
            let extension = pg_sys::get_extension_oid(c"rate_limiter".as_ptr(), false);
            let table = CStr::from_ptr((*(*relation).rd_rel).relname.data.as_ptr()).to_string_lossy().into_owned();
            for i in 0..(*triggers).numtriggers as usize {
                let trigger = &*(*triggers).triggers.add(i);
                if !is_own(&table, trigger, extension) {
                    return Some(format!("trigger \"{}\"", CStr::from_ptr(trigger.tgname).to_string_lossy()));
                }
            }
        }
        let rules = (*relation).rd_rules;
        if !rules.is_null() && (*rules).numLocks > 0 {
            let rule = &**(*rules).rules;
            return Some(format!("a rule (pg_rewrite oid {})", rule.ruleId.to_u32()));
        }
        None
    }
}

// pg_trigger.tgtype's bits (catalog/pg_trigger.h).
const ROW: i16 = 1 << 0;
const INSERT: i16 = 1 << 2;
const DELETE: i16 = 1 << 3;
const UPDATE: i16 = 1 << 4;
const TRUNCATE: i16 = 1 << 5;

/// Whether `trigger` on `table` is one the extension made (sql/finalize.sql): `<table>_changed`,
/// AFTER INSERT OR UPDATE OR DELETE of each row, or `<table>_truncated`, AFTER TRUNCATE, each
/// running the extension's own function with no WHEN and no arguments. The function alone
/// would not do: a planted trigger may run it BEFORE each row (which skips the row) or with a
/// WHEN clause of the planter's (which runs with the writer's rights).
///
/// # Safety
/// `trigger` is a trigger of the open relation named `table`.
unsafe fn is_own(table: &str, trigger: &pg_sys::Trigger, extension: pg_sys::Oid) -> bool {
    // SAFETY: the trigger's name is a NUL-terminated string of the open relation's descriptor.
    let name = unsafe { CStr::from_ptr(trigger.tgname) }.to_string_lossy();
    let shape = (name == format!("{table}_changed") && trigger.tgtype == ROW | INSERT | DELETE | UPDATE)
        || (name == format!("{table}_truncated") && trigger.tgtype == TRUNCATE);
    shape
        && !trigger.tgisinternal
        && trigger.tgqual.is_null()
        && trigger.tgnargs == 0
        // SAFETY: a catalog lookup by OID inside the caller's transaction.
        && unsafe { pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, trigger.tgfoid) } == extension
}
