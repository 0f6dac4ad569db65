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

/// The first trigger of `relation` whose function is not a member of the extension (an
/// internal one included: a foreign key's), or its first rule, as `trigger "name"`.
///
/// # Safety
/// `relation` is open.
pub unsafe fn planted_code(relation: pg_sys::Relation) -> Option<String> {
    // SAFETY: the caller's relation is open: its trigger descriptor is null or holds
    // `numtriggers` triggers, its rule lock null or `numLocks` rules.
    unsafe {
        let triggers = (*relation).trigdesc;
        if !triggers.is_null() {
            let extension = pg_sys::get_extension_oid(c"rate_limiter".as_ptr(), false);
            for i in 0..(*triggers).numtriggers as usize {
                let trigger = &*(*triggers).triggers.add(i);
                if trigger.tgisinternal || pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, trigger.tgfoid) != extension {
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
