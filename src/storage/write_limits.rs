//! The triggers that hold a table's writes to a limit (`rate_limiter.limit_writes`): the table
//! and its declared columns checked, the triggers' DDL run as the extension's owner, and a
//! statement's rows read from its transition table and summed per key.
//!
//! A write limit is a statement-level AFTER trigger, one per event, running
//! `rate_limiter._write_limited()` with five arguments: their version, the limit's name, the
//! key column and the count column ('' for none) and the inline config ('' for none). Only the
//! extension's owner may execute that function, so only `limit_writes` makes such triggers,
//! and `rate_limiter.write_limits` (the one place that decodes their arguments) knows them by
//! it. The rows are read through the column's type's output function (a base type's, which
//! only a superuser can create) and the numeric types' own conversions: no code of the
//! table's owner or of a writer runs with the extension's rights.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};

use pgrx::pg_sys::{self, Datum};
use pgrx::IntoDatum;

use crate::cache;
use crate::call::MAX_REQUESTS;
use crate::error::{Error, Result};

/// The first argument of every write limit's trigger: how the rest are laid out.
const ARGUMENTS_VERSION: &str = "1";
/// What the trigger calls the statement's rows (REFERENCING ... AS).
const TRANSITION: &str = "rate_limiter_rows";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Event {
    Insert,
    Update,
    Delete,
}

impl Event {
    pub fn parse(text: &str) -> Result<Event> {
        match text.to_ascii_uppercase().as_str() {
            "INSERT" => Ok(Event::Insert),
            "UPDATE" => Ok(Event::Update),
            "DELETE" => Ok(Event::Delete),
            _ => Err(Error::InvalidArgument(format!("events: {text:?} is not INSERT, UPDATE or DELETE"))),
        }
    }

    fn sql(self) -> &'static str {
        match self {
            Event::Insert => "INSERT",
            Event::Update => "UPDATE",
            Event::Delete => "DELETE",
        }
    }

    /// The rows it charges: an insert's or update's new rows, a delete's old ones.
    fn rows(self) -> &'static str {
        match self {
            Event::Delete => "OLD",
            Event::Insert | Event::Update => "NEW",
        }
    }
}

/// What a write limit declares.
pub struct Declared {
    pub limit: String,
    pub key: Option<String>,
    pub count: Option<String>,
    /// The inline config's jsonb text.
    pub config: Option<String>,
}

/// Locks `table` as CREATE TRIGGER does (against concurrent DDL and other declarations) and
/// refuses it unless it is a table or partitioned table of the user's that the current user
/// owns (or is a member of the owner's role).
pub fn lock_own_table(table: pg_sys::Oid) -> Result<()> {
    // Owned before it is locked, so that no one locks another's table (as RangeVarGetRelid's
    // callbacks check), and again once locked, which is what the triggers are made under.
    owned(table)?;
    // SAFETY: inside a transaction; the lock is kept to its end.
    unsafe { pg_sys::LockRelationOid(table, pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE) };
    owned(table)?;
    // SAFETY: a catalog lookup by OID inside the transaction (0 for a relation gone).
    let relkind = unsafe { pg_sys::get_rel_relkind(table) } as u8;
    let shown = || cache::qualified_name(table);
    if relkind != pg_sys::RELKIND_RELATION && relkind != pg_sys::RELKIND_PARTITIONED_TABLE {
        return Err(Error::NotSupported(format!("limiting the writes of {}, which is not a table", shown())));
    }
    // SAFETY: catalog lookups by OID and by name inside the transaction.
    let (catalog, extension, member_of) = unsafe {
        (
            pg_sys::IsCatalogRelationOid(table),
            pg_sys::get_extension_oid(c"rate_limiter".as_ptr(), false),
            pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, table),
        )
    };
    if catalog || member_of == extension {
        return Err(Error::NotSupported(format!("limiting the writes of {}, a table of the system or of rate_limiter", shown())));
    }
    Ok(())
}

/// Refuses a relation that is gone or that the current user does not own.
fn owned(table: pg_sys::Oid) -> Result<()> {
    // SAFETY: a catalog lookup by OID inside the transaction (InvalidOid for a relation gone).
    let owner = unsafe { pg_sys::get_rel_relkind(table) != 0 }.then(|| cache::owner(table));
    let Some(owner) = owner else {
        return Err(Error::RelationGone(format!("relation {}", table.to_u32())));
    };
    // SAFETY: reads the current user and the role graph inside the transaction.
    if !unsafe { pg_sys::has_privs_of_role(pg_sys::GetUserId(), owner) } {
        return Err(Error::WriteLimitDenied(format!("{}: this role does not own it", cache::qualified_name(table))));
    }
    Ok(())
}

/// Whether `role` may execute `rate_limiter.rate_limit`: what declaring a write limit takes,
/// and what its trigger asks of its table's owner each time it charges (a grant revoked, or
/// the table given to another role, ends what the limit may charge).
pub fn may_call_rate_limit(role: pg_sys::Oid) -> bool {
    let function = rate_limit_function();
    // SAFETY: has_function_privilege_id_id takes any role and function OID (NULL for a
    // function gone, read as no) and a text privilege.
    unsafe {
        pgrx::direct_function_call::<bool>(
            pg_sys::has_function_privilege_id_id,
            &[role.into_datum(), function.into_datum(), "EXECUTE".into_datum()],
        )
        .unwrap_or(false)
    }
}

thread_local! {
    /// `rate_limiter.rate_limit`'s OID, with the caches' generation it was found in: the
    /// extension dropped and made again moves the generation.
    static RATE_LIMIT: Cell<Option<(u64, pg_sys::Oid)>> = const { Cell::new(None) };
}

fn rate_limit_function() -> pg_sys::Oid {
    let generation = cache::generation();
    if let Some((found_in, oid)) = RATE_LIMIT.get() {
        if found_in == generation {
            return oid;
        }
    }
    let signature = c"rate_limiter.rate_limit(pg_catalog.text, pg_catalog.text, pg_catalog.float8, pg_catalog.bool, pg_catalog.bool, pg_catalog.jsonb)";
    // SAFETY: regprocedurein reads a NUL-terminated signature whose types are all qualified
    // (no search_path), and raises (caught by pgrx's guard) if the function is gone.
    let oid = unsafe { pgrx::direct_function_call::<pg_sys::Oid>(pg_sys::regprocedurein, &[Some(Datum::from(signature.as_ptr()))]) }
        .expect("regprocedurein never returns NULL");
    RATE_LIMIT.set(Some((generation, oid)));
    oid
}

/// Refuses a table (or partition) on which a role other than its owner holds TRIGGER: such a
/// role may replace any trigger of the table (CREATE OR REPLACE TRIGGER), a write limit's too.
pub fn no_other_trigger_rights(table: pg_sys::Oid) -> Result<()> {
    let find = "SELECT count(*)::pg_catalog.int4 FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a \
                WHERE (c.oid OPERATOR(pg_catalog.=) $1 OR c.oid OPERATOR(pg_catalog.=) ANY \
                       (SELECT t.relid FROM pg_catalog.pg_partition_tree($1) t)) \
                  AND a.privilege_type OPERATOR(pg_catalog.=) 'TRIGGER' AND a.grantee OPERATOR(pg_catalog.<>) c.relowner";
    let mut holders = 0;
    super::spi::run(cache::relations().limits, find, &[super::spi::oid_arg(table)], |row| holders = row.int4(1));
    if holders > 0 {
        return Err(Error::WriteLimitDenied(format!(
            "{}: a role other than its owner holds TRIGGER on it, and could replace the limit's trigger (REVOKE TRIGGER first)",
            cache::qualified_name(table)
        )));
    }
    Ok(())
}

/// The attribute number and type of `column`, a user column of `table`.
fn column(table: pg_sys::Oid, column: &str, role: &str) -> Result<(i16, pg_sys::Oid)> {
    let missing = || Error::WriteLimitColumn(format!("the {role} column {column:?} is not a column of {}", cache::qualified_name(table)));
    let name = CString::new(column).map_err(|_| missing())?;
    // SAFETY: catalog lookups inside the transaction; a missing or dropped column gives
    // InvalidAttrNumber, a system column a negative number.
    let attnum = unsafe { pg_sys::get_attnum(table, name.as_ptr()) };
    if attnum <= 0 {
        return Err(missing());
    }
    // SAFETY: as above, for a column that exists.
    Ok((attnum, unsafe { pg_sys::get_atttype(table, attnum) }))
}

/// A count column's type: one whose values the trigger reads as numbers itself.
#[derive(Clone, Copy)]
pub enum Number {
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Numeric,
}

impl Number {
    fn of(type_oid: pg_sys::Oid) -> Option<Number> {
        // SAFETY: a catalog lookup inside the transaction; a domain's base type, else the type.
        match unsafe { pg_sys::getBaseType(type_oid) } {
            pg_sys::INT2OID => Some(Number::Int2),
            pg_sys::INT4OID => Some(Number::Int4),
            pg_sys::INT8OID => Some(Number::Int8),
            pg_sys::FLOAT4OID => Some(Number::Float4),
            pg_sys::FLOAT8OID => Some(Number::Float8),
            pg_sys::NUMERICOID => Some(Number::Numeric),
            _ => None,
        }
    }

    fn read(self, datum: Datum) -> f64 {
        match self {
            Number::Int2 => datum.value() as i16 as f64,
            Number::Int4 => datum.value() as i32 as f64,
            Number::Int8 => datum.value() as i64 as f64,
            Number::Float4 => f32::from_bits(datum.value() as u32) as f64,
            Number::Float8 => f64::from_bits(datum.value() as u64),
            // SAFETY: a numeric datum of the row; numeric_float8 takes any numeric, NaN and
            // infinities included, and raises 22003 for one beyond a double's range, which
            // pgrx's guard turns into that error.
            Number::Numeric => unsafe { pgrx::direct_function_call::<f64>(pg_sys::numeric_float8, &[Some(datum)]) }
                .unwrap_or(f64::NAN),
        }
    }
}

/// The key column of `table`: its attribute number and type; refused if the table does not
/// have it, or if its type's text depends on the writer's settings (DateStyle, TimeZone,
/// extra_float_digits, bytea_output...), which would make one value several keys.
pub fn key_column(table: pg_sys::Oid, key: &str) -> Result<(i16, pg_sys::Oid)> {
    let (attnum, type_oid) = column(table, key, "key")?;
    // SAFETY: catalog lookups of the column's type inside the transaction.
    let (base, enumerated) = unsafe {
        let base = pg_sys::getBaseType(type_oid);
        (base, pg_sys::get_typtype(base) as u8 == pg_sys::TYPTYPE_ENUM)
    };
    const FIXED_TEXT: [pg_sys::Oid; 14] = [
        pg_sys::TEXTOID, pg_sys::VARCHAROID, pg_sys::BPCHAROID, pg_sys::NAMEOID, pg_sys::INT2OID, pg_sys::INT4OID,
        pg_sys::INT8OID, pg_sys::NUMERICOID, pg_sys::UUIDOID, pg_sys::BOOLOID, pg_sys::INETOID, pg_sys::CIDROID,
        pg_sys::MACADDROID, pg_sys::OIDOID,
    ];
    if enumerated || FIXED_TEXT.contains(&base) {
        return Ok((attnum, type_oid));
    }
    Err(Error::WriteLimitColumn(format!(
        "the key column {key:?} of {} is of a type whose text depends on the writer's settings: give a text, integer, numeric, uuid, boolean, network address or enum column",
        cache::qualified_name(table)
    )))
}

/// The count column of `table`: its attribute number and how its values are read; refused
/// if the table does not have it, or if its type is not a number's.
pub fn count_column(table: pg_sys::Oid, count: &str) -> Result<(i16, Number)> {
    let (attnum, type_oid) = column(table, count, "count")?;
    match Number::of(type_oid) {
        Some(number) => Ok((attnum, number)),
        None => Err(Error::WriteLimitColumn(format!(
            "the count column {count:?} of {} is not of an integer, numeric or floating-point type",
            cache::qualified_name(table)
        ))),
    }
}

/// The trigger's name: the event and a hash of the limit's name, so that each limit has its
/// own trigger per event whatever its name's length (a trigger's name is at most 63 bytes).
fn trigger_name(event: Event, limit: &str) -> String {
    // FNV-1a: stable across releases and servers, which a name must be.
    let hash = limit.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("rate_limiter_{}_{hash:016x}", event.sql().to_ascii_lowercase())
}

fn quoted_literal(text: &str) -> String {
    let c = CString::new(text).expect("no NUL in a name, column or jsonb text");
    // SAFETY: quote_literal_cstr copies the NUL-terminated text into a palloc'd,
    // NUL-terminated literal, read at once.
    unsafe { CStr::from_ptr(pg_sys::quote_literal_cstr(c.as_ptr())) }.to_string_lossy().into_owned()
}

fn quoted_identifier(text: &str) -> String {
    let c = CString::new(text).expect("no NUL in an identifier");
    // SAFETY: quote_identifier returns its argument or a palloc'd quoted copy, NUL-terminated.
    unsafe { CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr())) }.to_string_lossy().into_owned()
}

/// `table`, and every partition under it: a row written straight into a partition fires that
/// partition's statement triggers alone, one routed through the table the table's alone.
fn with_partitions(table: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    let mut tables = vec![table];
    let find = "SELECT t.relid::pg_catalog.oid FROM pg_catalog.pg_partition_tree($1) t \
                WHERE t.relid OPERATOR(pg_catalog.<>) $1 ORDER BY t.level, t.relid";
    super::spi::run(cache::relations().limits, find, &[super::spi::oid_arg(table)], |row| tables.push(row.oid(1)));
    tables
}

/// Makes the triggers of `declared` for `event` on `table` and its partitions, as the
/// extension's owner (the only role that may execute `_write_limited`).
pub fn create_triggers(table: pg_sys::Oid, event: Event, declared: &Declared) -> Result<()> {
    for table in with_partitions(table) {
        owned(table)?;
        create_trigger(table, event, declared);
    }
    Ok(())
}

fn create_trigger(table: pg_sys::Oid, event: Event, declared: &Declared) {
    let arguments = [
        ARGUMENTS_VERSION,
        &declared.limit,
        declared.key.as_deref().unwrap_or(""),
        declared.count.as_deref().unwrap_or(""),
        declared.config.as_deref().unwrap_or(""),
    ]
    .map(quoted_literal)
    .join(", ");
    let sql = format!(
        "CREATE TRIGGER {} AFTER {} ON {} REFERENCING {} TABLE AS {TRANSITION} FOR EACH STATEMENT \
         EXECUTE FUNCTION rate_limiter._write_limited({arguments})",
        quoted_identifier(&trigger_name(event, &declared.limit)),
        event.sql(),
        cache::qualified_name(table),
        event.rows(),
    );
    super::spi::run(cache::relations().limits, &sql, &[], |_| {});
}

/// Drops the write limits' triggers on `table` and its partitions (of `limit` alone, when
/// given); how many.
pub fn drop_triggers(table: pg_sys::Oid, limit: Option<&str>) -> i64 {
    let mut found = Vec::new();
    let find = "SELECT w.trigger_name::pg_catalog.text, w.\"table\"::pg_catalog.oid FROM rate_limiter.write_limits w \
                WHERE (w.\"table\" OPERATOR(pg_catalog.=) $1 OR w.\"table\" OPERATOR(pg_catalog.=) ANY \
                       (SELECT t.relid FROM pg_catalog.pg_partition_tree($1) t)) \
                  AND ($2 IS NULL OR w.limit_name OPERATOR(pg_catalog.=) $2) ORDER BY 2, 1";
    let args = [super::spi::oid_arg(table), super::spi::text_opt(limit)];
    super::spi::run(cache::relations().limits, find, &args, |row| found.push((row.text(1), row.oid(2))));
    for (name, table) in &found {
        let sql = format!("DROP TRIGGER {} ON {}", quoted_identifier(name), cache::qualified_name(*table));
        super::spi::run(cache::relations().limits, &sql, &[], |_| {});
    }
    found.len() as i64
}

/// A write limit's trigger as it fires: what it declares, its table and the statement's rows.
pub struct Fired {
    pub declared: Declared,
    pub table: pg_sys::Oid,
    rows: *mut pg_sys::Tuplestorestate,
    descriptor: pg_sys::TupleDesc,
}

/// The trigger data of a call of `_write_limited`, checked to be a write limit's trigger:
/// AFTER, FOR EACH STATEMENT, with this version's arguments and the rows it charges.
///
/// # Safety
/// `fcinfo` is a call by the function manager, whose `context` is null or a node.
pub unsafe fn fired(fcinfo: pg_sys::FunctionCallInfo) -> Result<Fired> {
    let wrong = |what: &str| Error::NotSupported(format!("rate_limiter._write_limited() {what}: only limit_writes() makes its triggers"));
    // SAFETY: by the caller's contract the context is null or a node, whose tag says whether
    // it is trigger data; a trigger's descriptor and relation are the executor's, valid for
    // the call, its arguments `tgnargs` NUL-terminated strings.
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_TriggerData {
            return Err(wrong("called other than as a trigger"));
        }
        let data = context.cast::<pg_sys::TriggerData>();
        let event = (*data).tg_event;
        let row = event & pg_sys::TRIGGER_EVENT_ROW != 0;
        let after = event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_AFTER;
        if row || !after {
            return Err(wrong("fired other than AFTER each statement"));
        }
        let trigger = &*(*data).tg_trigger;
        let arguments: Vec<String> = (0..trigger.tgnargs as usize)
            .map(|i| CStr::from_ptr(*trigger.tgargs.add(i)).to_string_lossy().into_owned())
            .collect();
        if arguments.len() != 5 || arguments[0] != ARGUMENTS_VERSION {
            return Err(wrong("fired with arguments it does not know"));
        }
        let rows = match event & pg_sys::TRIGGER_EVENT_OPMASK {
            pg_sys::TRIGGER_EVENT_DELETE => (*data).tg_oldtable,
            _ => (*data).tg_newtable,
        };
        if rows.is_null() {
            return Err(wrong("fired without the statement's rows"));
        }
        let relation = (*data).tg_relation;
        let some = |s: &String| (!s.is_empty()).then(|| s.clone());
        Ok(Fired {
            declared: Declared {
                limit: arguments[1].clone(),
                key: some(&arguments[2]),
                count: some(&arguments[3]),
                config: some(&arguments[4]),
            },
            table: (*relation).rd_id,
            rows,
            descriptor: (*relation).rd_att,
        })
    }
}

/// One key's share of a statement: its rows' counts summed.
pub struct Charge {
    pub key: Option<String>,
    pub count: f64,
}

/// A slot of the statement's rows, dropped with the reading.
struct Slot(*mut pg_sys::TupleTableSlot);

impl Drop for Slot {
    fn drop(&mut self) {
        // SAFETY: made by MakeSingleTupleTableSlot in `charges` and dropped once.
        unsafe { pg_sys::ExecDropSingleTupleTableSlot(self.0) }
    }
}

impl Fired {
    /// The statement's rows summed per key (the key column's text, or NULL), in the keys'
    /// order (NULL first, then bytewise); 22023 for a count that is NULL, negative or not
    /// finite, or for more keys than `rate_limit_all` takes (MAX_REQUESTS).
    pub fn charges(&self) -> Result<Vec<Charge>> {
        if !may_call_rate_limit(cache::owner(self.table)) {
            return Err(Error::WriteLimitDenied(format!(
                "{}: its owner may no longer execute rate_limiter.rate_limit",
                cache::qualified_name(self.table)
            )));
        }
        let key = self.declared.key.as_deref().map(|k| key_column(self.table, k)).transpose()?;
        let count = match self.declared.count.as_deref() {
            None => None,
            Some(c) => {
                let (attnum, number) = count_column(self.table, c)?;
                Some((attnum, number, c))
            }
        };
        let output = key.map(|(attnum, type_oid)| {
            let (mut function, mut varlena) = (pg_sys::InvalidOid, false);
            // SAFETY: a catalog lookup of the column's type inside the transaction.
            unsafe { pg_sys::getTypeOutputInfo(type_oid, &mut function, &mut varlena) };
            (attnum, function)
        });
        let mut sums: BTreeMap<Option<String>, f64> = BTreeMap::new();
        // SAFETY: the rows and descriptor are the firing trigger's, valid for the call. A read
        // pointer of its own, rewound, reads them all whatever other triggers read (as a scan
        // of the transition table does); each row's attributes are read through the slot
        // while it holds the row, and each output text is copied and freed.
        unsafe {
            let slot = Slot(pg_sys::MakeSingleTupleTableSlot(self.descriptor, &pg_sys::TTSOpsMinimalTuple));
            let pointer = pg_sys::tuplestore_alloc_read_pointer(self.rows, pg_sys::EXEC_FLAG_REWIND as i32);
            pg_sys::tuplestore_select_read_pointer(self.rows, pointer);
            pg_sys::tuplestore_rescan(self.rows);
            while pg_sys::tuplestore_gettupleslot(self.rows, true, false, slot.0) {
                pgrx::check_for_interrupts!();
                let key = match output {
                    None => None,
                    Some((attnum, function)) => attribute(slot.0, attnum).map(|datum| {
                        let text = pg_sys::OidOutputFunctionCall(function, datum);
                        let owned = CStr::from_ptr(text).to_string_lossy().into_owned();
                        pg_sys::pfree(text.cast());
                        owned
                    }),
                };
                let n = match count {
                    None => 1.0,
                    Some((attnum, number, name)) => {
                        let n = attribute(slot.0, attnum).map(|datum| number.read(datum));
                        match n {
                            Some(n) if n.is_finite() && n >= 0.0 => n,
                            _ => {
                                return Err(Error::InvalidArgument(format!(
                                    "the count column {name:?} of a row written to {} is {}, not a finite number >= 0",
                                    cache::qualified_name(self.table),
                                    n.map_or("NULL".to_owned(), |n| n.to_string())
                                )))
                            }
                        }
                    }
                };
                match sums.get_mut(&key) {
                    Some(sum) => *sum += n,
                    None => {
                        if sums.len() == MAX_REQUESTS {
                            return Err(Error::InvalidArgument(format!(
                                "a statement writing {} charges more than {MAX_REQUESTS} keys of \"{}\" at once: split it",
                                cache::qualified_name(self.table),
                                self.declared.limit
                            )));
                        }
                        sums.insert(key, n);
                    }
                }
            }
            pg_sys::tuplestore_select_read_pointer(self.rows, 0);
        }
        Ok(sums.into_iter().map(|(key, count)| Charge { key, count }).collect())
    }
}

/// The attribute `attnum` of the row in `slot`, or None for NULL.
///
/// # Safety
/// `slot` holds a row of a descriptor with at least `attnum` attributes.
unsafe fn attribute(slot: *mut pg_sys::TupleTableSlot, attnum: i16) -> Option<Datum> {
    // SAFETY: by the caller's contract; slot_getsomeattrs_int deforms up to `attnum`, after
    // which the arrays hold it.
    unsafe {
        if (*slot).tts_nvalid < attnum {
            pg_sys::slot_getsomeattrs_int(slot, attnum as i32);
        }
        let i = attnum as usize - 1;
        (!*(*slot).tts_isnull.add(i)).then(|| *(*slot).tts_values.add(i))
    }
}
