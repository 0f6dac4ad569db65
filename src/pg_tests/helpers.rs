//! What the `#[pg_test]`s share: running SQL, moving the fake clock, reading a decision,
//! and asserting an error's SQLSTATE.

use pgrx::prelude::*;

pub const T0: &str = "2026-01-01 00:00:00+00";

#[derive(Debug, PartialEq)]
pub struct D {
    pub ok: bool,
    pub retry_after: Option<f64>,
    pub remaining: f64,
    pub reset_after: f64,
    pub granted: f64,
}

pub fn run(sql: &str) {
    Spi::run(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
}

pub fn at(offset: &str) {
    // SET takes a literal only; compute it first.
    let ts: String = Spi::get_one(&format!(
        "SELECT ('{T0}'::timestamptz + interval '{offset}')::text"
    ))
    .unwrap()
    .unwrap();
    run(&format!("SET rate_limiter.fake_now = '{ts}'"));
}

pub fn decide(call: &str) -> D {
    Spi::connect_mut(|c| {
        let row = c
            .update(&format!("SELECT ok, retry_after, remaining, reset_after, granted FROM {call}"), None, &[])
            .unwrap_or_else(|e| panic!("{call}: {e}"))
            .first();
        D {
            ok: row.get(1).unwrap().unwrap(),
            retry_after: row.get(2).unwrap(),
            remaining: row.get(3).unwrap().unwrap(),
            reset_after: row.get(4).unwrap().unwrap(),
            granted: row.get(5).unwrap().unwrap(),
        }
    })
}

pub fn one<T: FromDatum + IntoDatum>(sql: &str) -> Option<T> {
    Spi::get_one(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Run `sql` and assert it fails with `sqlstate` (and, if given, a message containing `msg`).
pub fn fails(sql: &str, sqlstate: &str, msg: &str) {
    let escaped = sql.replace('\'', "''");
    let msg = msg.replace('\'', "''");
    run(&format!(
        "DO $t$ DECLARE st text; m text; BEGIN
             BEGIN EXECUTE '{escaped}';
             EXCEPTION WHEN OTHERS THEN GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, m = MESSAGE_TEXT;
             END;
             -- Qualified calls, so the check holds under a hostile search_path too.
             IF pg_catalog.textne(coalesce(st, ''), '{sqlstate}') OR pg_catalog.strpos(m, '{msg}') OPERATOR(pg_catalog.=) 0 THEN
                 RAISE 'expected SQLSTATE {sqlstate} with \"{msg}\", got % %', st, m;
             END IF;
         END $t$"
    ));
}

/// Run `sql`, assert it raises `RL429`, and return that error's DETAIL as JSON.
pub fn rl429_detail(sql: &str) -> serde_json::Value {
    let escaped = sql.replace('\'', "''");
    run(&format!(
        "DO $t$ DECLARE det text; BEGIN
             EXECUTE '{escaped}';
             RAISE 'expected RL429 from {escaped}';
         EXCEPTION WHEN SQLSTATE 'RL429' THEN
             GET STACKED DIAGNOSTICS det = PG_EXCEPTION_DETAIL;
             PERFORM set_config('rate_limiter_test.detail', det, true);
         END $t$"
    ));
    let detail = one::<String>("SELECT current_setting('rate_limiter_test.detail')").unwrap();
    serde_json::from_str(&detail).unwrap_or_else(|e| panic!("{detail}: {e}"))
}

/// A predicate on `rate_limiter.state` for the rows of `name` under inline configs, whose
/// `name` column is the name, '#' and the config's fingerprint.
pub fn inline_rows(name: &str) -> String {
    format!("name LIKE '{name}#%' AND shard < 0")
}

/// The `name` column of `name`'s rows under the inline `config` (a SQL literal, `'{...}'`).
pub fn inline_name(name: &str, config: &str) -> String {
    let json: serde_json::Value = serde_json::from_str(config.trim_matches('\'')).expect("a JSON object");
    let config = crate::config::from_json(&json).expect("a valid config");
    crate::storage::inline_name(name, &crate::config::fingerprint(&config))
}
