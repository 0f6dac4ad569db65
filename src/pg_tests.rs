//! `#[pg_test]` tests of the SQL surface, run inside PostgreSQL by `cargo pgrx test`.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    const T0: &str = "2026-01-01 00:00:00+00";

    #[derive(Debug, PartialEq)]
    struct D {
        ok: bool,
        retry_after: Option<f64>,
        remaining: f64,
        reset_after: f64,
        granted: f64,
    }

    fn run(sql: &str) {
        Spi::run(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    fn at(offset: &str) {
        // SET takes a literal only; compute it first.
        let ts: String = Spi::get_one(&format!(
            "SELECT ('{T0}'::timestamptz + interval '{offset}')::text"
        ))
        .unwrap()
        .unwrap();
        run(&format!("SET rate_limiter.fake_now = '{ts}'"));
    }

    fn decide(call: &str) -> D {
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

    fn one<T: FromDatum + IntoDatum>(sql: &str) -> Option<T> {
        Spi::get_one(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Run `sql` and assert it fails with `sqlstate` (and, if given, a message containing `msg`).
    fn fails(sql: &str, sqlstate: &str, msg: &str) {
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
    fn rl429_detail(sql: &str) -> serde_json::Value {
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

    const TB: &str = r#"'{"kind":"token bucket","rate":10,"period":60000}'"#;
    const FW: &str = r#"'{"kind":"fixed window","rate":10,"period":60000,"start":1767225600000}'"#;

    #[pg_test]
    fn token_bucket_convex_vectors() {
        at("0");
        let d = decide(&format!("rate_limiter.rate_limit('tb', count => 5, config => {TB})"));
        assert_eq!(d, D { ok: true, retry_after: None, remaining: 5.0, reset_after: 30_000.0, granted: 5.0 });
        at("6 seconds");
        let d = decide(&format!("rate_limiter.rate_limit('tb', count => 6, config => {TB})"));
        assert!(d.ok);
        assert_eq!(d.remaining, 0.0);
        let d = decide(&format!("rate_limiter.rate_limit('tb', count => 10, config => {TB})"));
        assert_eq!(d, D { ok: false, retry_after: Some(60_000.0), remaining: 0.0, reset_after: 60_000.0, granted: 0.0 });
    }

    #[pg_test]
    fn fixed_window_convex_vectors() {
        at("0");
        assert!(decide(&format!("rate_limiter.rate_limit('fw', count => 5, config => {FW})")).ok);
        at("6 seconds");
        let d = decide(&format!("rate_limiter.rate_limit('fw', count => 6, config => {FW})"));
        assert_eq!((d.ok, d.retry_after, d.remaining), (false, Some(54_000.0), 5.0));
        at("1 minute");
        let d = decide(&format!("rate_limiter.rate_limit('fw', count => 6, config => {FW})"));
        assert_eq!((d.ok, d.remaining), (true, 4.0));
        let d = decide(&format!("rate_limiter.rate_limit('fw', count => 10, config => {FW})"));
        assert_eq!((d.ok, d.retry_after), (false, Some(60_000.0)));
    }

    #[pg_test]
    fn reservations_match_convex() {
        for (kind, later, plus30, first, second, second_wait) in [
            ("token bucket", "6 seconds", "36 seconds", -10.0, -10.0, 60_000.0),
            ("fixed window", "1 minute", "90 seconds", -6.0, -11.0, 90_000.0),
        ] {
            let cfg = format!(r#"'{{"kind":"{kind}","rate":10,"period":60000,"start":{}}}'"#,
                if kind == "fixed window" { "1767225600000" } else { "null" });
            let name = kind.replace(' ', "_");
            at("0");
            decide(&format!("rate_limiter.rate_limit('{name}', count => 5, config => {cfg})"));
            at(later);
            let d = decide(&format!("rate_limiter.rate_limit('{name}', count => 16, reserve => true, config => {cfg})"));
            assert_eq!((d.ok, d.retry_after, d.remaining, d.granted), (true, Some(60_000.0), first, 16.0), "{kind}");
            at(plus30);
            let d = decide(&format!("rate_limiter.rate_limit('{name}', count => 5, reserve => true, config => {cfg})"));
            assert_eq!((d.ok, d.retry_after, d.remaining), (true, Some(second_wait), second), "{kind}");
        }
    }

    #[pg_test]
    fn max_reserved_denies_without_writing() {
        at("0");
        let cfg = r#"'{"kind":"token bucket","rate":1,"period":"1 hour","max_reserved":1}'"#;
        assert!(decide(&format!("rate_limiter.rate_limit('mr', count => 2, reserve => true, config => {cfg})")).ok);
        let d = decide(&format!("rate_limiter.rate_limit('mr', count => 1, reserve => true, config => {cfg})"));
        assert!(!d.ok);
        assert_eq!(d.remaining, -1.0);
        assert_eq!(one::<f64>("SELECT value FROM rate_limiter.state WHERE name = 'mr'"), Some(-1.0));
        fails(
            &format!("SELECT rate_limiter.rate_limit('mr', count => 3, reserve => true, config => {cfg})"),
            "22023",
            "Rate limit mr count 3 exceeds 2.00.",
        );
    }

    #[pg_test]
    fn named_limits_defaults_and_call_forms() {
        at("0");
        run("SELECT rate_limiter.define('send', 'token bucket', 10, '1 minute', capacity => 3)");
        assert_eq!(one::<bool>("SELECT (rate_limiter.rate_limit('send', key => 'u1')).ok"), Some(true));
        let d = decide("rate_limiter.rate_limit('send', key => 'u1', count => 2)");
        assert_eq!((d.ok, d.remaining, d.granted), (true, 0.0, 2.0));
        let d = decide("rate_limiter.rate_limit(name => 'send', key => 'u1')");
        assert_eq!((d.ok, d.retry_after), (false, Some(6_000.0)));
        // Another key and the NULL key are separate values.
        assert!(decide("rate_limiter.rate_limit('send', 'u2', 3)").ok);
        assert!(decide("rate_limiter.rate_limit('send')").ok);
        // A PL/pgSQL variable of the decision type.
        run("DO $$ DECLARE d rate_limiter.decision; BEGIN
               d := rate_limiter.rate_limit('send', key => 'u3');
               IF NOT d.ok OR d.remaining <> 2 THEN RAISE 'unexpected %', d; END IF;
             END $$");
        // define() is an upsert.
        run("SELECT rate_limiter.define('send', 'fixed window', 5, '1 second')");
        assert_eq!(one::<String>("SELECT kind FROM rate_limiter.limits WHERE name = 'send'").as_deref(), Some("fixed window"));
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.limits"), Some(1));
    }

    #[pg_test]
    fn check_writes_nothing_and_reset_forgets() {
        at("0");
        run("SELECT rate_limiter.define('c', 'token bucket', 2, '1 minute')");
        let d = decide("rate_limiter.check_rate_limit('c', 'k', 2)");
        assert_eq!((d.ok, d.remaining, d.granted), (true, 0.0, 2.0));
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state"), Some(0));
        decide("rate_limiter.rate_limit('c', 'k', 2)");
        let d = decide("rate_limiter.check_rate_limit('c', 'k')");
        assert_eq!((d.ok, d.retry_after), (false, Some(30_000.0)));
        run("SELECT rate_limiter.reset_rate_limit('c', 'k')");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state"), Some(0));
        assert!(decide("rate_limiter.check_rate_limit('c', 'k', 2)").ok);
    }

    #[pg_test]
    fn value_reports_state_and_effective_config() {
        at("0");
        run("SELECT rate_limiter.define('v', 'token bucket', 10, '1 minute', capacity => 20)");
        let fresh = one::<f64>("SELECT value FROM rate_limiter.rate_limit_value('v', 'k')");
        assert_eq!(fresh, Some(20.0));
        decide("rate_limiter.rate_limit('v', 'k', 5)");
        at("3 seconds");
        let (value, ts) = Spi::get_two::<f64, String>(
            "SELECT value, ts::text FROM rate_limiter.rate_limit_value('v', key => 'k')",
        )
        .unwrap();
        assert_eq!((value, ts.as_deref()), (Some(15.0), Some("2026-01-01 00:00:00+00")));
        let cfg = one::<pgrx::JsonB>("SELECT effective_config FROM rate_limiter.rate_limit_value('v', 'k')").unwrap();
        assert_eq!(
            cfg.0,
            serde_json::json!({"kind":"token bucket","rate":10,"period":60000,"capacity":20,"shards":1,"mode":"all"})
        );
        let start = one::<pgrx::JsonB>(
            r#"SELECT effective_config FROM rate_limiter.rate_limit_value('w', config => '{"kind":"fixed window","rate":1,"period":1000}')"#,
        )
        .unwrap();
        assert!(start.0["start"].as_f64().is_some(), "a fixed window reports its phase");
    }

    /// The issue's vector through SQL, named and inline, and what a sliding window refuses.
    #[pg_test]
    fn sliding_window_vector_and_refusals() {
        run(&format!("SELECT rate_limiter.define('sw', 'sliding window', 10, '1 minute', start => '{T0}')"));
        let inline = format!(r#"'{{"kind":"sliding window","rate":10,"period":"1 minute","start":"{T0}"}}'"#);
        for (name, config) in [("sw", String::new()), ("swi", format!(", config => {inline}"))] {
            let take = |count: u32| decide(&format!("rate_limiter.rate_limit('{name}', 'k', {count}{config})"));
            at("30 seconds");
            assert_eq!(take(4), D { ok: true, retry_after: None, remaining: 6.0, reset_after: 90_000.0, granted: 4.0 });
            at("75 seconds");
            let five = take(5);
            assert_eq!((five.ok, five.remaining), (true, 2.0), "{name}: 4 * 3/4 + 5 weigh");
            assert_eq!(take(2).remaining, 0.0);
            assert_eq!(take(1), D { ok: false, retry_after: Some(15_000.0), remaining: 0.0, reset_after: 105_000.0, granted: 0.0 });
            assert_eq!(take(0).granted, 0.0, "count 0 is answered");
            at("90 seconds");
            assert!(take(1).ok);
            let (value, ts) = Spi::get_two::<f64, String>(&format!(
                "SELECT value, ts::text FROM rate_limiter.rate_limit_value('{name}', 'k'{config})"
            ))
            .unwrap();
            assert_eq!((value, ts.as_deref()), (Some(2.0), Some("2026-01-01 00:01:00+00")), "10 - 8 in this window");
        }
        let cfg = one::<pgrx::JsonB>("SELECT effective_config FROM rate_limiter.rate_limit_value('sw')").unwrap();
        assert_eq!(cfg.0["kind"], "sliding window");
        fails("SELECT rate_limiter.rate_limit('sw', reserve => true)", "0A000", "no reservations");
        fails(
            r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"sliding window","rate":10,"period":1000,"capacity":5}')"#,
            "22023",
            "capacity must be NULL or equal to rate",
        );
        fails(
            r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"sliding window","rate":10,"period":1000,"maxReserved":1}')"#,
            "0A000",
            "maxReserved",
        );
        fails("SELECT rate_limiter.define('y', 'sliding window', 10, '1 minute', capacity => 20)", "22023", "capacity");
        fails(
            "INSERT INTO rate_limiter.limits (name, kind, rate, period, max_reserved) VALUES ('y', 'sliding window', 1, '1 hour', 1)",
            "23514",
            "limits_reservations_are_for_token_bucket_and_fixed_window",
        );
        fails(r#"SELECT rate_limiter.rate_limit('x', 'k', 11, config => '{"kind":"sliding window","rate":10,"period":1000}')"#, "22023", "exceeds");
        // Sharded: each of 2 shards holds 5; one call takes from one shard or levels both.
        let sharded = r#"'{"kind":"sliding window","rate":10,"period":"1 hour","shards":2}'"#;
        let granted: f64 = (0..40).map(|_| decide(&format!("rate_limiter.rate_limit('sws', config => {sharded})")).granted).sum();
        assert_eq!(granted, 10.0, "the shards' sum is the rate");
    }

    #[pg_test]
    fn a_denial_says_why_and_which_limit() {
        at("0");
        run("SELECT rate_limiter.define('why', 'token bucket', 1, '1 hour')");
        let reason = |call: &str| {
            Spi::get_two::<String, String>(&format!("SELECT reason, limited_by FROM {call}")).unwrap()
        };
        assert_eq!(reason("rate_limiter.rate_limit('why')"), (None, None), "ok: both NULL");
        let denied = (Some("exhausted".to_owned()), Some("why".to_owned()));
        assert_eq!(reason("rate_limiter.rate_limit('why')"), denied);
        assert_eq!(reason("rate_limiter.check_rate_limit('why')"), denied);
        assert_eq!(one::<bool>("SELECT (rate_limiter.rate_limit('why')).ok"), Some(false));
    }

    #[pg_test]
    fn min_gap_and_modes_through_sql() {
        at("0");
        run("SELECT rate_limiter.define('gap', 'token bucket', 100, '1 second', min_gap => '250 ms')");
        let why = |call: &str| {
            Spi::get_three::<bool, f64, String>(&format!("SELECT ok, retry_after, reason FROM {call}")).unwrap()
        };
        assert_eq!(why("rate_limiter.rate_limit('gap', 'k')").0, Some(true));
        at("100 milliseconds");
        assert_eq!(why("rate_limiter.rate_limit('gap', 'k')"), (Some(false), Some(150.0), Some("min_gap".into())));
        assert_eq!(one::<String>("SELECT limited_by FROM rate_limiter.rate_limit('gap', 'k')").as_deref(), Some("gap"));
        assert_eq!(why("rate_limiter.rate_limit('gap', 'other')").0, Some(true), "per key");
        at("250 milliseconds");
        assert_eq!(why("rate_limiter.rate_limit('gap', 'k')").0, Some(true));
        let inline = format!(
            r#"'{{"kind":"fixed window","rate":10,"period":"1 minute","start":"{T0}","minGap":"1 second","mode":"partial"}}'"#
        );
        assert!(decide(&format!("rate_limiter.rate_limit('gi', 'k', 4, config => {inline})")).ok);
        at("2 seconds");
        let d = decide(&format!("rate_limiter.rate_limit('gi', 'k', 8, config => {inline})"));
        assert_eq!((d.ok, d.granted, d.remaining, d.retry_after), (true, 6.0, 0.0, Some(58_000.0)), "partial");
        fails(&format!("SELECT rate_limiter.rate_limit('gi', 'k', 11, config => {inline})"), "22023", "exceeds 10");
        let cfg = one::<pgrx::JsonB>(&format!("SELECT effective_config FROM rate_limiter.rate_limit_value('gi', config => {inline})")).unwrap();
        assert_eq!((cfg.0["minGap"].as_f64(), cfg.0["mode"].as_str()), (Some(1000.0), Some("partial")));

        run("SELECT rate_limiter.define('pen', 'token bucket', 10, '10 seconds', mode => 'penalize')");
        assert!(decide("rate_limiter.rate_limit('pen', 'k', 10)").ok);
        let denied = decide("rate_limiter.rate_limit('pen', 'k', 4)");
        assert_eq!((denied.ok, denied.remaining, denied.retry_after), (false, -4.0, Some(8_000.0)), "counted");
        assert_eq!(one::<f64>("SELECT value FROM rate_limiter.state WHERE name = 'pen'"), Some(-4.0), "written");
        for _ in 0..5 {
            decide("rate_limiter.rate_limit('pen', 'k', 4)");
        }
        assert_eq!(one::<f64>("SELECT value FROM rate_limiter.state WHERE name = 'pen'"), Some(-10.0), "capped");
        assert!(!decide("rate_limiter.check_rate_limit('pen', 'k', 4)").ok);
        assert_eq!(one::<f64>("SELECT value FROM rate_limiter.state WHERE name = 'pen'"), Some(-10.0), "check writes nothing");

        fails("SELECT rate_limiter.define('x', 'token bucket', 1, '1 hour', mode => 'some')", "22023", "unknown mode");
        fails("SELECT rate_limiter.define('x', 'token bucket', 1, '1 hour', on_lock_timeout => 'maybe')", "22023", "on_lock_timeout");
        fails("SELECT rate_limiter.define('x', 'token bucket', 1, '1 hour', shards => 2, lock_timeout => '1 s')", "0A000", "shards = 1");
        let lt = r#"'{"kind":"token bucket","rate":1,"period":1000,"lockTimeout":"250 ms","onLockTimeout":"allow"}'"#;
        let cfg = one::<pgrx::JsonB>(&format!("SELECT effective_config FROM rate_limiter.rate_limit_value('lt', config => {lt})")).unwrap();
        assert_eq!((cfg.0["lockTimeout"].as_f64(), cfg.0["onLockTimeout"].as_str()), (Some(250.0), Some("allow")));
        fails("SELECT rate_limiter.define('x', 'token bucket', 1, '1 hour', min_gap => '-1 s')", "22023", "minGap");
        fails("SELECT rate_limiter.define('x', 'token bucket', 1, '1 hour', shards => 2, mode => 'partial')", "0A000", "shards = 1");
        fails("SELECT rate_limiter.define('x', 'token bucket', 1, '1 hour', shards => 2, min_gap => '1 s')", "0A000", "shards = 1");
        fails("SELECT rate_limiter.rate_limit('pen', reserve => true)", "0A000", "no reservations");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":1,"period":1,"minGap":-5}')"#, "22023", "minGap");
        fails(
            "INSERT INTO rate_limiter.limits (name, kind, rate, period, shards, mode) VALUES ('y', 'token bucket', 1, '1 hour', 2, 'penalize')",
            "23514",
            "limits_one_row_per_key_for_min_gap_and_modes",
        );
    }

    /// The issue's vector through SQL, the row size at the most buckets, and refusals.
    #[pg_test]
    fn rolling_window_vector_row_size_and_refusals() {
        run(&format!("SELECT rate_limiter.define('rw', 'rolling window', 3, '1 second', start => '{T0}')"));
        let take = || decide("rate_limiter.rate_limit('rw', 'k')");
        for offset in ["0", "100 ms", "500 ms"] {
            at(offset);
            assert!(take().ok, "{offset}");
        }
        at("900 ms");
        assert_eq!((take().ok, take().retry_after), (false, Some(200.0)));
        at("1100 ms");
        assert!(take().ok);
        at("1150 ms");
        let denied = take();
        assert_eq!((denied.ok, denied.retry_after, denied.remaining), (false, Some(50.0), 0.0));
        let (value, ts, cfg) = Spi::get_three::<f64, String, pgrx::JsonB>(
            "SELECT value, ts::text, effective_config FROM rate_limiter.rate_limit_value('rw', 'k')",
        )
        .unwrap();
        assert_eq!((value, ts.as_deref()), (Some(0.0), Some("2026-01-01 00:00:01.1+00")), "3 count, newest cell at 1.1 s");
        assert_eq!(cfg.unwrap().0["buckets"], 10, "the default");
        assert_eq!(one::<i32>("SELECT array_length(counts, 1) FROM rate_limiter.state WHERE name = 'rw'"), Some(11));

        // The longest name and key with the most cells stay below 2,032 bytes: no TOAST.
        let key = "k".repeat(1024);
        let name = "n".repeat(128);
        let most = r#"'{"kind":"rolling window","rate":1000,"period":"1 hour","buckets":64}'"#;
        run(&format!("SELECT rate_limiter.rate_limit('{name}', '{key}', config => {most})"));
        let size = one::<i32>(&format!("SELECT pg_column_size(s.*) FROM rate_limiter.state s WHERE name = '{name}'"));
        assert!(size.unwrap() < 2032, "{size:?} bytes");

        fails("SELECT rate_limiter.rate_limit('rw', reserve => true)", "0A000", "no reservations");
        fails("SELECT rate_limiter.define('x', 'rolling window', 1, '1 hour', capacity => 2)", "22023", "capacity");
        fails("SELECT rate_limiter.define('x', 'rolling window', 1, '1 hour', buckets => 65)", "22023", "between 1 and 64");
        fails("SELECT rate_limiter.define('x', 'rolling window', 1, '1 hour', buckets => 0)", "22023", "between 1 and 64");
        fails("SELECT rate_limiter.define('x', 'token bucket', 1, '1 hour', buckets => 4)", "22023", "only to a rolling window");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"rolling window","rate":1,"period":1000,"buckets":2.5}')"#, "22023", "integer");
        fails(
            "INSERT INTO rate_limiter.limits (name, kind, rate, period, buckets) VALUES ('y', 'fixed window', 1, '1 hour', 3)",
            "23514",
            "limits_buckets_are_for_rolling_window",
        );
    }

    #[pg_test]
    fn rate_limit_all_takes_all_or_nothing() {
        at("0");
        run("SELECT rate_limiter.define('per_min', 'token bucket', 3, '1 minute')");
        run("SELECT rate_limiter.define('per_hour', 'token bucket', 4, '1 hour')");
        let both = |count: u32| {
            format!(r#"'[{{"name":"per_min","key":"u","count":{count}}},{{"name":"per_hour","key":"u","count":{count}}}]'"#)
        };
        let all = |count: u32| decide(&format!("rate_limiter.rate_limit_all({})", both(count)));
        let d = all(2);
        assert_eq!((d.ok, d.remaining, d.granted), (true, 1.0, 2.0), "the least remaining");
        let d = all(2);
        assert_eq!((d.ok, d.retry_after, d.granted), (false, Some(20_000.0), 0.0), "per_min lacks 1: 20 s");
        let values = || one::<String>("SELECT string_agg(name || '=' || value, ',' ORDER BY name) FROM rate_limiter.state");
        assert_eq!(values().as_deref(), Some("per_hour=2,per_min=1"), "neither was taken");
        assert_eq!(
            Spi::get_two::<String, String>(&format!("SELECT reason, limited_by FROM rate_limiter.check_rate_limit_all({})", both(2)))
                .unwrap(),
            (Some("exhausted".into()), Some("per_min".into()))
        );
        at("1 minute");
        // per_min is full again (3); per_hour has 2 and a fifteenth: it lacks most and waits longest.
        let d = all(3);
        assert!(!d.ok && d.retry_after.unwrap() > 800_000.0, "{d:?}");
        assert_eq!(one::<String>(&format!("SELECT limited_by FROM rate_limiter.rate_limit_all({})", both(3))).as_deref(), Some("per_hour"));
        let detail = rl429_detail(
            r#"SELECT rate_limiter.rate_limit_all('[{"name":"per_min","key":"u"},{"name":"per_hour","key":"u","count":3}]', throws => true)"#,
        );
        assert_eq!((&detail["name"], &detail["key"]), (&serde_json::json!("per_hour"), &serde_json::json!("u")), "{detail}");
        // Inline configs, default count and key.
        let inline = r#"'[{"name":"a","config":{"kind":"fixed window","rate":1,"period":1000}},{"name":"per_min"}]'"#;
        assert!(decide(&format!("rate_limiter.rate_limit_all({inline})")).ok);
        assert!(!decide(&format!("rate_limiter.check_rate_limit_all({inline})")).ok);

        fails("SELECT rate_limiter.rate_limit_all('{}')", "22023", "JSON array");
        fails("SELECT rate_limiter.rate_limit_all('[]')", "22023", "at least one");
        fails("SELECT rate_limiter.rate_limit_all(NULL)", "22023", "must not be NULL");
        fails(r#"SELECT rate_limiter.rate_limit_all('[{"name":"per_min","limit":1}]')"#, "22023", "unknown member");
        fails(r#"SELECT rate_limiter.rate_limit_all('[{"key":"u"}]')"#, "22023", "name must not be NULL");
        fails(r#"SELECT rate_limiter.rate_limit_all('[{"name":"per_min"},{"name":"per_min"}]')"#, "22023", "twice");
        fails(r#"SELECT rate_limiter.rate_limit_all('[{"name":"nope"}]')"#, "42704", "does not exist");
        fails(r#"SELECT rate_limiter.rate_limit_all('[{"name":"per_min","count":-1}]')"#, "22023", "count");
        fails(
            r#"SELECT rate_limiter.rate_limit_all('[{"name":"p","config":{"kind":"token bucket","rate":1,"period":1,"mode":"partial"}}]')"#,
            "0A000",
            "all or nothing",
        );
        fails(
            r#"SELECT rate_limiter.rate_limit_all('[{"name":"s","config":{"kind":"sliding window","rate":1,"period":1}}]', reserve => true)"#,
            "0A000",
            "no reservations",
        );
    }

    /// Boundary instants and shards of the new kinds.
    #[pg_test]
    fn window_kinds_at_their_boundaries_and_sharded() {
        let sliding = format!(r#"'{{"kind":"sliding window","rate":4,"period":1000,"start":"{T0}"}}'"#);
        // Each config under a name of its own: inline configs of one name share rows.
        let take = |cfg: &str, count: u32| {
            let name = if cfg.contains("sliding") { "bs" } else { "br" };
            decide(&format!("rate_limiter.rate_limit('{name}', 'k', {count}, config => {cfg})"))
        };
        at("999 ms");
        assert!(take(&sliding, 4).ok, "the last instant of window 0");
        at("1 second");
        let d = take(&sliding, 1);
        assert_eq!((d.ok, d.retry_after), (false, Some(250.0)), "at the boundary the 4 weigh fully");
        at("1250 ms");
        assert!(take(&sliding, 1).ok);
        at("3 seconds");
        assert_eq!(take(&sliding, 4).remaining, 0.0, "two windows later nothing weighs");

        let rolling = format!(r#"'{{"kind":"rolling window","rate":2,"period":1000,"buckets":4,"start":"{T0}"}}'"#);
        at("249 ms");
        assert!(take(&rolling, 2).ok, "the last instant of cell 0");
        at("1249 ms");
        assert_eq!(take(&rolling, 1).retry_after, Some(1.0), "cell 0 counts until 1250");
        at("1250 ms");
        assert!(take(&rolling, 2).ok);

        // Sharded rolling window: 2 shards of 5; the sum never exceeds the rate.
        let sharded = r#"'{"kind":"rolling window","rate":10,"period":"1 hour","shards":2}'"#;
        let granted: f64 = (0..40).map(|_| decide(&format!("rate_limiter.rate_limit('rws', config => {sharded})")).granted).sum();
        assert_eq!(granted, 10.0);
    }

    #[pg_test]
    fn http_headers_for_single_and_several_limits() {
        at("0");
        run("SELECT rate_limiter.define('api', 'token bucket', 10, '1 minute')");
        let headers = |sql: &str| one::<pgrx::JsonB>(sql).unwrap().0;
        assert_eq!(
            headers("SELECT rate_limiter.http_headers('api', rate_limiter.rate_limit('api', 'k', 7))"),
            serde_json::json!({"RateLimit-Policy": "\"api\";q=10;w=60", "RateLimit": "\"api\";r=3;t=42"})
        );
        assert_eq!(
            headers("SELECT rate_limiter.http_headers('api', d) FROM rate_limiter.rate_limit('api', 'k', 5) d"),
            serde_json::json!({"RateLimit-Policy": "\"api\";q=10;w=60", "RateLimit": "\"api\";r=3;t=12", "Retry-After": "12"})
        );
        let inline = r#"'{"kind":"fixed window","rate":2,"period":"1 second"}'"#;
        let h = headers(&format!(
            "SELECT rate_limiter.http_headers('w', rate_limiter.rate_limit('w', config => {inline}), {inline})"
        ));
        assert_eq!(h["RateLimit-Policy"], "\"w\";q=2;w=1");
        let requests = r#"'[{"name":"api","key":"k","count":4},{"name":"w","config":{"kind":"fixed window","rate":2,"period":1000}}]'"#;
        let h = headers(&format!("SELECT rate_limiter.http_headers_all({requests}, rate_limiter.rate_limit_all({requests}))"));
        assert_eq!(h["RateLimit-Policy"], "\"api\";q=10;w=60, \"w\";q=2;w=1");
        assert_eq!(h["RateLimit"], "\"api\";r=1;t=6", "api denied 4 of its 3; w keeps its 1: the least remaining, api's wait");
        assert_eq!(h["Retry-After"], "6");
        fails("SELECT rate_limiter.http_headers('api', NULL)", "22023", "d must not be NULL");
        fails("SELECT rate_limiter.http_headers('nope', rate_limiter.check_rate_limit('api'))", "42704", "does not exist");
        run("SELECT rate_limiter.define('é', 'token bucket', 1, '1 minute')");
        fails("SELECT rate_limiter.http_headers('é', rate_limiter.check_rate_limit('é'))", "22023", "printable ASCII");
    }

    #[pg_test]
    fn blocked_keys_are_denied_without_their_state() {
        at("0");
        run("SELECT rate_limiter.define('api', 'token bucket', 10, '1 minute')");
        run(&format!("SELECT rate_limiter.block('api', 'bad', '{T0}'::timestamptz + interval '10 seconds', 'scraper')"));
        let why = |call: &str| {
            Spi::get_three::<f64, String, String>(&format!("SELECT retry_after, reason, limited_by FROM {call}")).unwrap()
        };
        let blocked = (Some(10_000.0), Some("blocked".into()), Some("api".into()));
        assert_eq!(why("rate_limiter.rate_limit('api', 'bad')"), blocked);
        assert_eq!(why("rate_limiter.check_rate_limit('api', 'bad')"), blocked);
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state"), Some(0), "no state read or written");
        assert!(decide("rate_limiter.rate_limit('api', 'good')").ok);
        // A block without a name covers every limit, inline ones too; without an end, no retry_after.
        run("SELECT rate_limiter.block(NULL, 'evil')");
        let inline = r#"'{"kind":"fixed window","rate":5,"period":1000}'"#;
        assert_eq!(why(&format!("rate_limiter.rate_limit('x', 'evil', config => {inline})")), (None, Some("blocked".into()), Some("x".into())));
        assert_eq!(
            rl429_detail("SELECT rate_limiter.rate_limit('api', 'evil', throws => true)"),
            serde_json::json!({"kind":"RateLimited","name":"api","key":"evil","retryAfter":null,"reason":"blocked"})
        );
        let all = r#"'[{"name":"api","key":"good"},{"name":"api","key":"evil"}]'"#;
        assert_eq!(why(&format!("rate_limiter.rate_limit_all({all})")), (None, Some("blocked".into()), Some("api".into())));
        // Ended blocks are ignored, and prune() removes them.
        at("10 seconds");
        assert!(decide("rate_limiter.rate_limit('api', 'bad')").ok);
        assert_eq!(one::<i64>("SELECT rate_limiter.prune()"), Some(2), "the ended block, and good's refilled row");
        assert_eq!(one::<bool>("SELECT rate_limiter.unblock(NULL, 'evil')"), Some(true));
        assert_eq!(one::<bool>("SELECT rate_limiter.unblock(NULL, 'evil')"), Some(false));
        assert!(decide("rate_limiter.rate_limit('api', 'evil')").ok);
        fails("SELECT rate_limiter.block('api', 'k', NULL)", "22023", "until must not be NULL");
        fails(&format!("SELECT rate_limiter.block('api', '{}')", "k".repeat(1025)), "22023", "1024");
        fails("SELECT rate_limiter.block('', 'k')", "22023", "empty");
    }

    #[pg_test]
    fn inline_config_spellings() {
        at("0");
        for cfg in [
            r#"{"kind":"token bucket","rate":2,"period":1000,"maxReserved":1,"capacity":2}"#,
            r#"{"kind":"token bucket","rate":2,"period":"1 second","max_reserved":1,"capacity":2,"shards":1,"start":null}"#,
        ] {
            let d = decide(&format!("rate_limiter.rate_limit('spell', count => 3, reserve => true, config => '{cfg}')"));
            assert_eq!((d.ok, d.retry_after), (true, Some(500.0)), "{cfg}");
            run("SELECT rate_limiter.reset_rate_limit('spell')");
        }
    }

    #[pg_test]
    fn throws_raises_rl429_with_json_detail() {
        at("0");
        run("SELECT rate_limiter.define('t', 'token bucket', 1, '1 second')");
        assert!(decide("rate_limiter.rate_limit('t', 'k', throws => true)").ok);
        fails("SELECT rate_limiter.rate_limit('t', 'k', throws => true)", "RL429", "rate limit \"t\" exceeded");
        fails("SELECT rate_limiter.check_rate_limit('t', 'k', throws => true)", "RL429", "exceeded");
        // With reserve, it raises whenever the caller would have to wait.
        fails("SELECT rate_limiter.rate_limit('t', 'k', reserve => true, throws => true)", "RL429", "exceeded");
        assert_eq!(
            rl429_detail("SELECT rate_limiter.rate_limit('t', 'k', throws => true)"),
            serde_json::json!({"kind":"RateLimited","name":"t","key":"k","retryAfter":1000})
        );
        // The raise rolled the reservation back.
        assert_eq!(one::<f64>("SELECT value FROM rate_limiter.state WHERE name = 't'"), Some(0.0));
    }

    #[pg_test]
    fn bad_input_gets_proper_sqlstates_and_changes_nothing() {
        at("0");
        run("SELECT rate_limiter.define('ok', 'token bucket', 1, '1 second')");
        fails("SELECT rate_limiter.rate_limit('nope')", "42704", "rate limit \"nope\" does not exist");
        fails("SELECT rate_limiter.rate_limit(NULL)", "22023", "name must not be NULL");
        fails("SELECT rate_limiter.rate_limit('')", "22023", "name must not be empty");
        fails("SELECT rate_limiter.rate_limit('ok', count => 'NaN')", "22023", "count");
        fails("SELECT rate_limiter.rate_limit('ok', count => 'Infinity')", "22023", "count");
        fails("SELECT rate_limiter.rate_limit('ok', count => -1)", "22023", "count");
        fails("SELECT rate_limiter.rate_limit('ok', count => NULL)", "22023", "count");
        fails("SELECT rate_limiter.rate_limit('ok', count => 2)", "22023", "Rate limit ok count 2 exceeds 1.");
        fails("SELECT rate_limiter.rate_limit('ok', key => repeat('x', 100000))", "22023", "key is 100000 bytes");
        fails("SELECT rate_limiter.rate_limit('x', config => '[1]')", "22P02", "expected a JSON object");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":"ten","period":1}')"#, "22P02", "\"rate\" must be a number");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"leaky","rate":1,"period":1}')"#, "22023", "unknown kind");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":0,"period":1}')"#, "22023", "rate must be");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":1,"period":-5}')"#, "22023", "period must be");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":1,"period":1,"shards":0}')"#, "22023", "shards");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":1,"period":1,"bogus":1}')"#, "22023", "unknown key");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"rate":1,"period":1}')"#, "22023", "\"kind\" is required");
        fails("SELECT rate_limiter.define('d', 'token bucket', -1, '1 second')", "22023", "rate must be");
        fails("SELECT rate_limiter.define('d', 'token bucket', 1, '0 seconds')", "22023", "period must be");
        fails("SELECT rate_limiter.define('d', 'token bucket', 1, '1 second', shards => 0)", "22023", "shards");
        fails("INSERT INTO rate_limiter.limits (name, kind, rate, period) VALUES ('d', 'token bucket', 'NaN', '1 second')", "23514", "");
        fails("INSERT INTO rate_limiter.limits (name, kind, rate, period) VALUES ('d', 'other', 1, '1 second')", "23514", "");
        fails("SELECT rate_limiter.rate_limit_value('ok', sample_shards => 0)", "22023", "sample_shards");
        fails("SELECT rate_limiter.reset_rate_limit(NULL)", "22023", "name");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state"), Some(0));
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.limits"), Some(1));
    }

    #[pg_test]
    fn numbers_and_instants_out_of_range_are_refused_not_stored() {
        at("0");
        // jsonb holds these; a double cannot (pgrx's own parsing raised XX000).
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":1e400,"period":1}')"#, "22023", "double precision");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":1,"period":1,"junk":-1e999}')"#, "22023", "double precision");
        fails(r#"SELECT * FROM rate_limiter.rate_limit_value('x', config => '{"kind":"token bucket","rate":1e400,"period":1}')"#, "22023", "double precision");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"fixed window","rate":1,"period":1,"start":"infinity"}')"#, "22008", "start");
        // Within decades of the largest timestamp: the microsecond conversion used to wrap
        // into a wrong finite start; now the windows are aligned to it.
        run(r#"SELECT rate_limiter.rate_limit('late', config => '{"kind":"fixed window","rate":1,"period":"1 day","start":"294270-01-01"}')"#);
        let aligned = one::<bool>(&format!(
            "SELECT ts > '{T0}'::timestamptz - interval '1 day 1 second' AND ts <= '{T0}' FROM rate_limiter.state WHERE name = 'late'"
        ));
        assert_eq!(aligned, Some(true));
        run("DELETE FROM rate_limiter.state");
        fails("SELECT rate_limiter.define('d', 'fixed window', 1, '1 second', start => 'infinity')", "22008", "start");
        // A window so long that its start or end falls outside what PostgreSQL can store.
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"fixed window","rate":1,"period":1e19}')"#, "22008", "instant out of range");
        run("SET rate_limiter.fake_now = 'infinity'");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":1,"period":1}')"#, "22008", "fake_now");
        run("SET rate_limiter.fake_now = '-infinity'");
        fails(r#"SELECT rate_limiter.check_rate_limit('x', config => '{"kind":"token bucket","rate":1,"period":1}')"#, "22008", "fake_now");
        at("0");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state"), Some(0));
        // Every stored instant stays printable.
        run(r#"SELECT rate_limiter.rate_limit('far', config => '{"kind":"fixed window","rate":1,"period":"1000 years"}')"#);
        assert_eq!(one::<bool>("SELECT bool_and(isfinite(ts) AND ts::text <> '') FROM rate_limiter.state"), Some(true));
    }

    #[pg_test]
    fn writes_record_when_the_row_expires_and_prune_removes_only_expired_rows() {
        at("0");
        let cfg = r#"'{"kind":"token bucket","rate":10,"period":"10 seconds"}'"#;
        run(&format!("SELECT rate_limiter.rate_limit('p', 'a', 4, config => {cfg})"));
        run(&format!("SELECT rate_limiter.rate_limit('p', 'b', 10, config => {cfg})"));
        run("SELECT rate_limiter.define('pf', 'fixed window', 5, '1 minute', start => '2026-01-01')");
        run("SELECT rate_limiter.rate_limit('pf', 'a')");
        let expires = |key: &str, name: &str| {
            one::<f64>(&format!(
                "SELECT extract(epoch FROM expires - '{T0}')::float8 FROM rate_limiter.state WHERE name = '{name}' AND key = '{key}'"
            ))
        };
        assert_eq!(expires("a", "p"), Some(4.0), "4 tokens at 1 per second");
        assert_eq!(expires("b", "p"), Some(10.0));
        assert_eq!(expires("a", "pf"), Some(60.0), "the next window");
        assert_eq!(one::<i64>("SELECT rate_limiter.prune()"), Some(0));
        at("5 seconds");
        assert_eq!(one::<i64>("SELECT rate_limiter.prune()"), Some(1), "p/a has refilled");
        at("1 minute");
        assert_eq!(one::<i64>("SELECT rate_limiter.prune(max_rows => 1)"), Some(1));
        assert_eq!(one::<i64>("SELECT rate_limiter.prune()"), Some(1));
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state"), Some(0));
        // Pruned keys start full, as they would have been.
        assert_eq!(decide(&format!("rate_limiter.rate_limit('p', 'b', 10, config => {cfg})")).remaining, 0.0);
        fails("SELECT rate_limiter.prune(-1)", "22023", "max_rows");
        fails("SELECT rate_limiter.prune(NULL)", "22023", "max_rows");
    }

    #[pg_test]
    fn a_named_limit_and_an_inline_config_of_the_same_name_keep_separate_rows() {
        at("0");
        let cfg = r#"'{"kind":"token bucket","rate":10,"period":"1 hour","shards":2}'"#;
        run("SELECT rate_limiter.define('both', 'token bucket', 10, '1 hour')");
        run("SELECT rate_limiter.rate_limit('both', 'a', 3)");
        run(&format!("SELECT rate_limiter.rate_limit('both', 'a', 4, config => {cfg})"));
        let values = |sign: &str| {
            one::<f64>(&format!("SELECT sum(value) FROM rate_limiter.state WHERE name = 'both' AND shard {sign} 0"))
        };
        assert_eq!(values(">="), Some(7.0), "named: shard 0 holds 10 - 3");
        assert_eq!(values("<"), Some(1.0), "inline: shard -1 - s holds 5 - 4");
        // Rows of deleted named limits are pruned: see tests/isolation/specs/prune_orphans.spec
        // (it needs no other transaction changing limits, which parallel #[pg_test]s may do).
    }

    #[pg_test]
    fn writing_functions_refuse_read_only_transactions_with_25006() {
        at("0");
        run("SELECT rate_limiter.define('ro', 'token bucket', 1, '1 second')");
        run("SET transaction_read_only = on");
        fails("SELECT rate_limiter.reset_rate_limit('ro')", "25006", "read-only");
        fails("SELECT rate_limiter.define('ro', 'token bucket', 2, '1 second')", "25006", "read-only");
        fails("SELECT rate_limiter.prune()", "25006", "read-only");
        fails("SELECT rate_limiter.block('ro', 'k')", "25006", "read-only");
        fails("SELECT rate_limiter.unblock('ro', 'k')", "25006", "read-only");
        fails("SELECT rate_limiter.rate_limit('ro')", "25006", "read-only");
        assert!(decide("rate_limiter.check_rate_limit('ro')").ok);
    }

    #[pg_test]
    fn fake_clock_moves_time_and_empty_means_real() {
        at("0");
        let cfg = r#"'{"kind":"token bucket","rate":1,"period":"1 hour"}'"#;
        assert!(decide(&format!("rate_limiter.rate_limit('clock', config => {cfg})")).ok);
        assert!(!decide(&format!("rate_limiter.rate_limit('clock', config => {cfg})")).ok);
        at("1 hour 1 second");
        assert!(decide(&format!("rate_limiter.rate_limit('clock', config => {cfg})")).ok);
        // Back in time: nothing refills, ts does not move backwards.
        at("0");
        assert!(!decide(&format!("rate_limiter.rate_limit('clock', config => {cfg})")).ok);
        run("SET rate_limiter.fake_now = ''");
        let ts = one::<bool>("SELECT abs(extract(epoch FROM ts - clock_timestamp())) < 60 FROM rate_limiter.rate_limit_value('real', config => '{\"kind\":\"token bucket\",\"rate\":1,\"period\":1000}')");
        assert_eq!(ts, Some(true));
    }

    #[pg_test]
    fn subtransaction_rollback_gives_tokens_back() {
        at("0");
        run("SELECT rate_limiter.define('sp', 'token bucket', 1, '1 hour')");
        run("DO $$ BEGIN
               BEGIN
                 PERFORM rate_limiter.rate_limit('sp');
                 RAISE EXCEPTION 'roll back';
               EXCEPTION WHEN raise_exception THEN NULL;
               END;
             END $$");
        assert!(decide("rate_limiter.rate_limit('sp')").ok);
        assert!(!decide("rate_limiter.rate_limit('sp')").ok);
    }

    #[pg_test]
    fn many_updates_in_one_statement_keep_one_row_per_key() {
        // 20 calls on each of 300 keys in one statement: old versions cannot be pruned yet,
        // so pages fill and updates move rows to other pages (new index entries).
        at("0");
        run("SELECT rate_limiter.define('many', 'token bucket', 1, '1 hour', 100)");
        let granted: Option<f64> = one(
            "SELECT sum(d.granted) FROM generate_series(0, 5999) g, \
             LATERAL rate_limiter.rate_limit('many', (g % 300)::text) d",
        );
        assert_eq!(granted, Some(6000.0));
        let rows: Option<i64> = one("SELECT count(*) FROM rate_limiter.state WHERE name = 'many'");
        assert_eq!(rows, Some(300));
        let values: Option<String> =
            one("SELECT string_agg(DISTINCT value::text, ',') FROM rate_limiter.state WHERE name = 'many'");
        assert_eq!(values.as_deref(), Some("80"));
        let via_index: Option<i64> = one(
            "SELECT count(*) FROM generate_series(0, 299) g, \
             LATERAL rate_limiter.rate_limit_value('many', g::text) v WHERE v.value = 80",
        );
        assert_eq!(via_index, Some(300));
    }

    #[pg_test]
    fn defining_a_limit_applies_at_once_in_the_same_transaction() {
        at("0");
        run("SELECT rate_limiter.define('redefined', 'token bucket', 1, '1 hour')");
        assert_eq!(decide("rate_limiter.check_rate_limit('redefined')").remaining, 0.0);
        run("SELECT rate_limiter.define('redefined', 'token bucket', 5, '1 hour')");
        assert_eq!(decide("rate_limiter.check_rate_limit('redefined')").remaining, 4.0);
        run("UPDATE rate_limiter.limits SET capacity = 10 WHERE name = 'redefined'");
        assert_eq!(decide("rate_limiter.check_rate_limit('redefined')").remaining, 9.0);
        run("DELETE FROM rate_limiter.limits WHERE name = 'redefined'");
        fails("SELECT rate_limiter.check_rate_limit('redefined')", "42704", "does not exist");
    }

    #[pg_test]
    fn hostile_search_path_changes_nothing() {
        at("0");
        run("SELECT rate_limiter.define('h', 'token bucket', 1, '1 hour')");
        run("CREATE SCHEMA evil");
        run("CREATE FUNCTION evil.texteq_evil(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'");
        run("CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq_evil)");
        run("CREATE FUNCTION evil.format(text, text) RETURNS text LANGUAGE sql AS $$SELECT 'hijacked'$$");
        run("SET search_path = evil, pg_catalog");
        assert!(decide("rate_limiter.rate_limit('h', 'a')").ok);
        // With the evil '=' every key would match; qualified operators keep keys apart.
        assert!(decide("rate_limiter.rate_limit('h', 'b')").ok);
        fails("SELECT rate_limiter.rate_limit('h', 'a', throws => true)", "RL429", "rate limit \"h\" exceeded");
        run("RESET search_path");
    }

    /// Seed every shard of the NULL key of `name` with `value(shard)` at T0.
    /// Store the shards of an inline config (whose rows have shard numbers -1 - shard).
    fn seed(name: &str, shards: i32, value: impl Fn(i32) -> f64) {
        run(&format!("DELETE FROM rate_limiter.state WHERE name = '{name}'"));
        for shard in 0..shards {
            run(&format!(
                "INSERT INTO rate_limiter.state VALUES ('{name}', NULL, -1 - {shard}, {}, '{T0}', 'infinity')",
                value(shard)
            ));
        }
    }

    fn sharded_config(shards: i32, extra: &str) -> String {
        format!(r#"'{{"kind":"token bucket","rate":1,"period":1000,"shards":{shards},"capacity":{}{extra}}}'"#, 10 * shards)
    }

    /// Sum of an inline config's shards' values and how many rows differ from `seeded`.
    fn shard_changes(name: &str, seeded: impl Fn(i32) -> f64) -> (f64, usize) {
        Spi::connect(|c| {
            let rows = c
                .select(&format!("SELECT -1 - shard, value FROM rate_limiter.state WHERE name = '{name}'"), None, &[])
                .unwrap();
            let mut sum = 0.0;
            let mut changed = 0;
            for row in rows {
                let shard: i32 = row.get(1).unwrap().unwrap();
                let value: f64 = row.get(2).unwrap().unwrap();
                sum += value;
                changed += usize::from(value != seeded(shard));
            }
            (sum, changed)
        })
    }

    /// The Convex component's sharding cases, for 1 to 4 shards.
    #[pg_test]
    fn sharding_convex_cases() {
        at("0");
        for shards in 1..=4 {
            let cfg = sharded_config(shards, "");
            let call = |extra: &str| decide(&format!("rate_limiter.rate_limit('s', config => {cfg}{extra})"));

            // Success when all shards have enough: one shard pays.
            seed("s", shards, |_| 1.0);
            let d = call("");
            assert_eq!((d.ok, d.retry_after), (true, None), "{shards} shards");
            assert_eq!(shard_changes("s", |_| 1.0), (f64::from(shards) - 1.0, 1));

            // Unbounded reservations work.
            seed("s", shards, |_| 0.0);
            let d = call(", reserve => true");
            assert!(d.ok && d.retry_after.unwrap() >= 1000.0, "{shards}: {d:?}");
            assert_eq!(shard_changes("s", |_| 0.0), (-1.0, 1));

            // Failure when no shard has enough, with throws.
            fails(&format!("SELECT rate_limiter.rate_limit('s', throws => true, config => {cfg})"), "RL429", "exceeded");
            assert_eq!(shard_changes("s", |_| 0.0), (-1.0, 1), "the failed call wrote nothing");

            // Success when at least one of the two has enough.
            let third_short = |shard: i32| if shard == 2 { -1.0 } else { 1.0 };
            seed("s", shards, third_short);
            let d = call("");
            assert_eq!((d.ok, d.retry_after), (true, None), "{shards} shards");
            assert_eq!(shard_changes("s", third_short).1, 1);

            // Reservations fail when maxed out.
            seed("s", shards, |_| 1.0);
            let d = decide(&format!(
                "rate_limiter.rate_limit('s', count => 3, reserve => true, config => {})",
                sharded_config(shards, r#","maxReserved":1"#)
            ));
            assert!(!d.ok && d.retry_after.unwrap() >= 1000.0, "{shards}: {d:?}");
            assert_eq!(shard_changes("s", |_| 1.0), (f64::from(shards), 0));

            // Reservations work if one of the shards has capacity.
            seed("s", shards, third_short);
            let cfg_rate = format!(
                r#"'{{"kind":"token bucket","rate":{shards},"period":1000,"shards":{shards},"capacity":{},"maxReserved":{shards}}}'"#,
                10 * shards
            );
            let d = decide(&format!("rate_limiter.rate_limit('s', count => 2, reserve => true, config => {cfg_rate})"));
            assert_eq!((d.ok, d.retry_after), (true, Some(1000.0)), "{shards} shards");
            assert_eq!(shard_changes("s", third_short).1, 1);

            // From 3 shards: two half-full shards together serve one token and end level.
            if shards >= 3 {
                seed("s", shards, |_| 0.5);
                let d = call("");
                assert_eq!((d.ok, d.retry_after), (true, None), "{shards} shards");
                assert_eq!(shard_changes("s", |_| 0.5), (f64::from(shards) * 0.5 - 1.0, 2));
            }
        }
    }

    #[pg_test]
    fn sharded_counts_values_and_reset() {
        at("0");
        let cfg = r#"'{"kind":"token bucket","rate":40,"period":1000,"shards":4}'"#;
        fails(
            &format!("SELECT rate_limiter.rate_limit('sh', count => 21, config => {cfg})"),
            "22023",
            "Rate limit sh count 21 exceeds 20 per 4 shards.",
        );
        // count 20 = two whole shards: taken from both, which end level at 0.
        let d = decide(&format!("rate_limiter.rate_limit('sh', count => 20, config => {cfg})"));
        assert!(d.ok, "{d:?}");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state WHERE name = 'sh' AND value = 0"), Some(2));
        // Sampling every shard reports the fullest: a full one (fresh shards are full).
        let fullest = one::<f64>(&format!("SELECT value FROM rate_limiter.rate_limit_value('sh', config => {cfg}, sample_shards => 4)"));
        assert_eq!(fullest, Some(10.0));
        run("SELECT rate_limiter.reset_rate_limit('sh')");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state WHERE name = 'sh'"), Some(0));
    }

    #[pg_test]
    fn functions_are_volatile_parallel_unsafe_and_private() {
        // Only the header formatters are STABLE (they read configs, write nothing) and
        // PARALLEL RESTRICTED (they use the backend's config cache); the statistics'
        // functions are VOLATILE and PARALLEL RESTRICTED (their NOTICE is the leader's).
        let wrong = one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'rate_limiter'::regnamespace
               AND (provolatile, proparallel) <> CASE
                   WHEN proname LIKE 'http_headers%' THEN ('s'::\"char\", 'r'::\"char\")
                   WHEN proname IN ('_stats', '_top_denied', 'stats_reset') THEN ('v'::\"char\", 'r'::\"char\")
                   ELSE ('v'::\"char\", 'u'::\"char\") END",
        );
        assert_eq!(wrong, Some(0));
        let public = one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'rate_limiter'::regnamespace
               AND has_function_privilege('public', oid, 'EXECUTE')",
        );
        assert_eq!(public, Some(0), "nothing is executable by PUBLIC");
    }
}
