//! Plain SQL on one of the extension's tables through SPI, for the tables that are rare beside
//! the calls (leases, the memory snapshot): every index, constraint and publication stays
//! informed, and each statement
//!
//! - reads what is committed now (the latest snapshot, as foreign-key checks do), whatever
//!   the caller's isolation level;
//! - runs as the table's owner (as foreign-key checks do), since callers hold EXECUTE on the
//!   functions and no privilege on the tables.

use std::ffi::CString;

use pgrx::pg_sys::{self, Datum};
use pgrx::{FromDatum, IntoDatum};

use crate::cache;

use super::instant;

pub type Arg = (pg_sys::Oid, Option<Datum>);

pub fn text_arg(s: &str) -> Arg {
    (pg_sys::TEXTOID, s.into_datum())
}

pub fn text_opt(s: Option<&str>) -> Arg {
    (pg_sys::TEXTOID, s.and_then(|s| s.into_datum()))
}

pub fn oid_arg(oid: pg_sys::Oid) -> Arg {
    (pg_sys::OIDOID, Some(Datum::from(oid)))
}

pub fn ts_arg(ms: f64, what: &str) -> Arg {
    (pg_sys::TIMESTAMPTZOID, Some(instant(ms, what)))
}

pub fn uuid_arg(id: &[u8; 16]) -> Arg {
    (pg_sys::UUIDOID, pgrx::datum::Uuid::from_bytes(*id).into_datum())
}

/// One result row, read by column number (from 1).
pub struct ResultRow {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    /// The table the statement is about, to name in an error.
    table: pg_sys::Oid,
}

impl ResultRow {
    /// Refuses a column of another type than the one about to be read through a pointer: the
    /// tables read here are the extension's, and their owner may ALTER a column's type.
    fn require_type(&self, column: i32, expected: pg_sys::Oid) {
        // SAFETY: SPI's current result descriptor, read while SPI is connected; a column
        // number out of range gives InvalidOid, which differs from every expected type.
        let found = unsafe { pg_sys::SPI_gettypeid(self.desc, column) };
        if found != expected {
            crate::error::Error::ShapeChanged {
                relation: crate::cache::qualified_name(self.table),
                detail: format!("column {column} of a result is of type OID {}, not {}", found.to_u32(), expected.to_u32()),
            }
            .raise()
        }
    }

    fn datum(&self, column: i32) -> Datum {
        let mut is_null = false;
        // SAFETY: a row of SPI's current result and its descriptor, read while SPI is
        // connected; every column read here is NOT NULL in the table or computed non-null.
        let datum = unsafe { pg_sys::SPI_getbinval(self.tuple, self.desc, column, &mut is_null) };
        assert!(!is_null, "column {column} is never NULL");
        datum
    }

    pub fn int4(&self, column: i32) -> i32 {
        self.datum(column).value() as i32
    }

    pub fn int8(&self, column: i32) -> i64 {
        // A bigint is passed by value (PostgreSQL 15 and later build with 8-byte datums).
        self.datum(column).value() as i64
    }

    /// A float8 column that may be NULL.
    pub fn float8_or_null(&self, column: i32) -> Option<f64> {
        let mut is_null = false;
        // SAFETY: as in `datum`.
        let datum = unsafe { pg_sys::SPI_getbinval(self.tuple, self.desc, column, &mut is_null) };
        // SAFETY: a float8 datum of SPI's current result, read while SPI is connected.
        unsafe { f64::from_datum(datum, is_null) }
    }

    /// An interval column that may be NULL.
    pub fn interval_or_null(&self, column: i32) -> Option<pgrx::datum::Interval> {
        self.require_type(column, pg_sys::INTERVALOID);
        let mut is_null = false;
        // SAFETY: as in `datum`.
        let datum = unsafe { pg_sys::SPI_getbinval(self.tuple, self.desc, column, &mut is_null) };
        // SAFETY: an interval datum of SPI's current result, read while SPI is connected.
        unsafe { pgrx::datum::Interval::from_datum(datum, is_null) }
    }

    pub fn bool(&self, column: i32) -> bool {
        self.datum(column).value() != 0
    }

    /// A text column that may be NULL.
    pub fn text_or_null(&self, column: i32) -> Option<String> {
        self.require_type(column, pg_sys::TEXTOID);
        let mut is_null = false;
        // SAFETY: as in `datum`.
        let datum = unsafe { pg_sys::SPI_getbinval(self.tuple, self.desc, column, &mut is_null) };
        // SAFETY: a text datum of SPI's current result, read while SPI is connected.
        (!is_null).then(|| unsafe { String::from_datum(datum, false) }.expect("not NULL"))
    }

    pub fn oid(&self, column: i32) -> pg_sys::Oid {
        self.require_type(column, pg_sys::OIDOID);
        pg_sys::Oid::from(self.datum(column).value() as u32)
    }

    pub fn text(&self, column: i32) -> String {
        self.require_type(column, pg_sys::TEXTOID);
        // SAFETY: a text datum of SPI's current result, read while SPI is connected.
        unsafe { String::from_datum(self.datum(column), false) }.expect("not NULL")
    }

    pub fn timestamptz(&self, column: i32) -> f64 {
        crate::clock::pg_us_to_ms(self.datum(column).value() as i64)
    }

    pub fn bytea(&self, column: i32) -> Vec<u8> {
        self.require_type(column, pg_sys::BYTEAOID);
        // SAFETY: a bytea datum of SPI's current result, read while SPI is connected.
        unsafe { Vec::<u8>::from_datum(self.datum(column), false) }.expect("not NULL")
    }

    pub fn uuid(&self, column: i32) -> [u8; 16] {
        self.require_type(column, pg_sys::UUIDOID);
        let ptr = self.datum(column).cast_mut_ptr::<u8>();
        let mut id = [0; 16];
        // SAFETY: a uuid datum points at its 16 bytes (pass by reference, fixed length).
        unsafe { std::ptr::copy_nonoverlapping(ptr, id.as_mut_ptr(), 16) };
        id
    }
}

/// `run` a statement that writes `table`, once the table is locked and its triggers and
/// rules checked (`guard`): the owner's rights must run nothing a caller planted.
pub fn write(table: pg_sys::Oid, sql: &str, args: &[Arg], each: impl FnMut(&ResultRow)) {
    super::guard::writable(table);
    run(table, sql, args, each)
}

/// Run `sql` on `table` with `args` ($1, $2, ... in order) as the table's owner, reading
/// what is committed now, and visit each row it returns.
pub fn run(table: pg_sys::Oid, sql: &str, args: &[Arg], mut each: impl FnMut(&ResultRow)) {
    let owner = cache::owner(table);
    let _as_owner = AsOwner::switch(owner);
    let sql = CString::new(sql).expect("no NUL in the SQL");
    let mut types: Vec<pg_sys::Oid> = args.iter().map(|a| a.0).collect();
    let mut values: Vec<Datum> = args.iter().map(|a| a.1.unwrap_or(Datum::from(0))).collect();
    let nulls: Vec<std::ffi::c_char> = args.iter().map(|a| if a.1.is_some() { b' ' } else { b'n' } as std::ffi::c_char).collect();
    pgrx::spi::Spi::connect(|_| {
        // SAFETY: SPI is connected for this closure; the plan is freed before it returns (an
        // error frees it with SPI's memory); the latest snapshot is copied by SPI before it
        // runs the statement; the arrays hold one entry per argument.
        unsafe {
            let plan = pg_sys::SPI_prepare(sql.as_ptr(), args.len() as i32, types.as_mut_ptr());
            if plan.is_null() {
                let code = pg_sys::SPI_result;
                panic!("SPI_prepare failed ({code}): {}", sql.to_string_lossy());
            }
            let status = pg_sys::SPI_execute_snapshot(
                plan,
                values.as_mut_ptr(),
                nulls.as_ptr(),
                pg_sys::GetLatestSnapshot(),
                std::ptr::null_mut(),
                false,
                true,
                0,
            );
            if status < 0 {
                panic!("SPI_execute_snapshot failed ({status}): {}", sql.to_string_lossy());
            }
            let result = pg_sys::SPI_tuptable;
            if !result.is_null() {
                for i in 0..pg_sys::SPI_processed as usize {
                    each(&ResultRow { tuple: *(*result).vals.add(i), desc: (*result).tupdesc, table });
                }
            }
            pg_sys::SPI_freeplan(plan);
        }
    });
}

/// The current user switched to `owner` until dropped, as foreign-key checks switch to a
/// table's owner: row-level security of the owner's own table is not forced on it.
struct AsOwner {
    user: pg_sys::Oid,
    context: i32,
}

impl AsOwner {
    fn switch(owner: pg_sys::Oid) -> AsOwner {
        let (mut user, mut context) = (pg_sys::InvalidOid, 0);
        // SAFETY: reads and sets this backend's current user; restored on drop, and by the
        // (sub)transaction's abort on an error.
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
            let local = (pg_sys::SECURITY_LOCAL_USERID_CHANGE | pg_sys::SECURITY_NOFORCE_RLS) as i32;
            pg_sys::SetUserIdAndSecContext(owner, context | local);
        }
        AsOwner { user, context }
    }
}

impl Drop for AsOwner {
    fn drop(&mut self) {
        // SAFETY: gives back what `switch` read.
        unsafe { pg_sys::SetUserIdAndSecContext(self.user, self.context) }
    }
}
