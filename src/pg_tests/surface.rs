//! The SQL surface: call forms and defaults, checks and resets, the decision's fields,
//! several limits at once, headers, blocks, inline configs, RL429, errors and their
//! SQLSTATEs, and every function's volatility, parallel safety and privileges.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::*;

    /// A name or key read in place (stored plain, ASCII: a short header in a row, a long one
    /// in a literal) and one the server must detoast (compressed in its row, or out of line)
    /// or whose encoding is checked (not ASCII) are the same text, and so the same key.
    #[pg_test]
    fn a_key_is_its_text_however_it_is_stored() {
        run("SELECT rate_limiter.define('stored', 'token bucket', 1, '1 day', 3)");
        run("CREATE TABLE stored_keys (key text COMPRESSION pglz, filler text, outside text)");
        run("ALTER TABLE stored_keys ALTER key SET STORAGE MAIN, ALTER filler SET STORAGE PLAIN, ALTER outside SET STORAGE EXTERNAL");
        // The row is too long for a page's share: `outside` goes out of line, `key` is compressed.
        run("INSERT INTO stored_keys SELECT repeat('k', 1000), string_agg(md5(g::text), ''), repeat('o', 1000) FROM generate_series(1, 100) g");
        run("INSERT INTO stored_keys VALUES ('ab', '', ''), ('é', '', '')");
        assert_eq!(one::<String>("SELECT pg_column_compression(key) FROM stored_keys WHERE length(key) = 1000").as_deref(), Some("pglz"));
        let toast = one::<String>("SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 'stored_keys'::regclass").unwrap();
        assert!(one::<i64>(&format!("SELECT count(*) FROM {toast}")).unwrap() > 0, "outside is out of line");
        let ok = |key: &str| one::<bool>(&format!("SELECT (rate_limiter.rate_limit('stored', {key})).ok")).unwrap();
        let ok_stored = |column: &str, which: &str| {
            one::<bool>(&format!("SELECT (rate_limiter.rate_limit('stored', {column})).ok FROM stored_keys WHERE {which}")).unwrap()
        };
        for (column, stored, literal) in [
            ("key", "length(key) = 1000", "repeat('k', 1000)"),
            ("outside", "length(outside) = 1000", "repeat('o', 1000)"),
            ("key", "key = 'ab'", "'ab'"),
            ("key", "key = 'é'", "'é'"),
        ] {
            assert!(ok_stored(column, stored) && ok(literal) && ok_stored(column, stored), "{literal}: three of three");
            assert!(!ok(literal) && !ok_stored(column, stored), "{literal}: one key, whether stored or written");
        }
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

    #[pg_test]
    fn http_headers_for_single_and_several_limits() {
        at("0");
        run("SELECT rate_limiter.define('api', 'token bucket', 10, '1 minute')");
        let headers = |sql: &str| one::<pgrx::JsonB>(sql).unwrap().0;
        assert_eq!(
            headers("SELECT rate_limiter.http_headers('api', rate_limiter.rate_limit('api', 'k', 7), key => 'k')"),
            serde_json::json!({"RateLimit-Policy": "\"api\";q=10;qu=\"requests\";w=60", "RateLimit": "\"api\";r=3;t=42"})
        );
        assert_eq!(
            headers("SELECT rate_limiter.http_headers('api', d, draft => 9) FROM rate_limiter.rate_limit('api', 'k', 5) d"),
            serde_json::json!({"RateLimit-Policy": "\"api\";q=10;w=60", "RateLimit": "\"api\";r=3;t=12", "Retry-After": "12"})
        );
        // The key's own numbers, and the key itself as pk when asked for.
        run("SELECT rate_limiter.override('api', 'pro', rate => 100)");
        let h = headers("SELECT rate_limiter.http_headers('api', rate_limiter.rate_limit('api', 'pro'), key => 'pro', partition_key => true)");
        assert_eq!(h["RateLimit-Policy"], "\"api\";q=100;qu=\"requests\";w=60;pk=:cHJv:");
        assert_eq!(h["RateLimit"], "\"api\";r=99;t=1;pk=:cHJv:");
        let inline = r#"'{"kind":"fixed window","rate":2,"period":"1 second"}'"#;
        let h = headers(&format!(
            "SELECT rate_limiter.http_headers('w', rate_limiter.rate_limit('w', config => {inline}), {inline})"
        ));
        assert_eq!(h["RateLimit-Policy"], "\"w\";q=2;qu=\"requests\";w=1");
        let requests = r#"'[{"name":"api","key":"k","count":4},{"name":"w","config":{"kind":"fixed window","rate":2,"period":1000}}]'"#;
        let h = headers(&format!("SELECT rate_limiter.http_headers_all({requests}, rate_limiter.rate_limit_all({requests}), draft => 9)"));
        assert_eq!(h["RateLimit-Policy"], "\"api\";q=10;w=60, \"w\";q=2;w=1");
        assert_eq!(
            h["RateLimit"], "\"api\";r=1;t=6",
            "api denied 4 of its 3; w keeps its 1: the least remaining, api's wait"
        );
        assert_eq!(h["Retry-After"], "6");
        // The problem-details body of the denial; none for an allowed call.
        let problem = headers(&format!("SELECT rate_limiter.http_problem(rate_limiter.rate_limit_all({requests}))"));
        assert_eq!(problem["violated-policies"], serde_json::json!(["api"]));
        assert_eq!(problem["type"], "https://iana.org/assignments/http-problem-types#quota-exceeded");
        assert_eq!(problem["rate_limiter-reason"], "exhausted");
        assert_eq!(one::<pgrx::JsonB>("SELECT rate_limiter.http_problem(rate_limiter.check_rate_limit('api', 'new'))").map(|j| j.0), None);
        fails("SELECT rate_limiter.http_headers('api', NULL)", "22023", "d must not be NULL");
        fails("SELECT rate_limiter.http_headers('api', rate_limiter.check_rate_limit('api'), draft => 10)", "22023", "draft must be 9 or 11");
        fails("SELECT rate_limiter.http_problem(NULL)", "22023", "d must not be NULL");
        fails(
            "SELECT rate_limiter.http_headers('nope', rate_limiter.check_rate_limit('api'))",
            "42704",
            "does not exist",
        );
        run("SELECT rate_limiter.define('é', 'token bucket', 1, '1 minute')");
        fails(
            "SELECT rate_limiter.http_headers('é', rate_limiter.check_rate_limit('é'))",
            "22023",
            "printable ASCII",
        );
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
    fn allowed_keys_are_let_through_without_their_state_and_a_block_wins() {
        at("0");
        run("SELECT rate_limiter.define('api', 'token bucket', 2, '1 minute')");
        run(&format!("SELECT rate_limiter.allow('api', 'health', '{T0}'::timestamptz + interval '10 seconds', 'probe')"));
        let answer = |call: &str| {
            let d = decide(call);
            let reason = one::<String>(&format!("SELECT reason FROM {call}"));
            (d.ok, d.granted, d.remaining, d.retry_after, reason)
        };
        // ok, granted what was asked, remaining the limit's capacity (nothing of it used).
        let allowed = |count: f64, capacity: f64| (true, count, capacity, None, Some("allowed".to_owned()));
        for _ in 0..5 {
            assert_eq!(answer("rate_limiter.rate_limit('api', 'health', 2)"), allowed(2.0, 2.0), "never limited");
        }
        assert_eq!(answer("rate_limiter.check_rate_limit('api', 'health')"), allowed(1.0, 2.0));
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state"), Some(0), "no state read or written");
        // Other keys and limits are metered as usual.
        assert!(decide("rate_limiter.rate_limit('api', 'other', 2)").ok);
        assert!(!decide("rate_limiter.rate_limit('api', 'other')").ok);
        // Without a name, the key under every limit, inline ones too.
        run("SELECT rate_limiter.allow(NULL, 'internal')");
        let inline = r#"'{"kind":"fixed window","rate":1,"period":1000}'"#;
        for _ in 0..3 {
            assert_eq!(answer(&format!("rate_limiter.rate_limit('x', 'internal', config => {inline})")), allowed(1.0, 1.0));
        }
        // An allowed request of rate_limit_all is ok and takes no part; the others decide.
        let all = r#"'[{"name":"api","key":"health","count":2},{"name":"api","key":"third"}]'"#;
        let d = decide(&format!("rate_limiter.rate_limit_all({all})"));
        assert_eq!((d.ok, d.granted, d.remaining), (true, 1.0, 1.0), "the metered request's numbers");
        assert_eq!(one::<f64>("SELECT 2 - value FROM rate_limiter.state WHERE key = 'third'"), Some(1.0));
        // A block wins over an allow, whichever of them names the limit.
        let reason = || one::<String>("SELECT reason FROM rate_limiter.rate_limit('api', 'health')");
        run("SELECT rate_limiter.block(NULL, 'health')");
        assert_eq!(reason().as_deref(), Some("blocked"), "a block under every name, an allow under this one");
        run("SELECT rate_limiter.unblock(NULL, 'health')");
        run("SELECT rate_limiter.block('api', 'health')");
        assert_eq!(reason().as_deref(), Some("blocked"), "both under this name");
        run("SELECT rate_limiter.allow(NULL, 'health')");
        assert_eq!(reason().as_deref(), Some("blocked"), "an allow under every name too");
        run("SELECT rate_limiter.unblock('api', 'health')");
        run("SELECT rate_limiter.disallow(NULL, 'health')");
        // Ended allows are ignored, and prune() removes them; disallow says whether there was one.
        at("10 seconds");
        assert_eq!(answer("rate_limiter.check_rate_limit('api', 'health')").4, None, "metered again");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.allows"), Some(2));
        run("SELECT rate_limiter.prune()");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.allows"), Some(1), "the ended allow is gone");
        assert_eq!(one::<bool>("SELECT rate_limiter.disallow(NULL, 'internal')"), Some(true));
        assert_eq!(one::<bool>("SELECT rate_limiter.disallow(NULL, 'internal')"), Some(false));
        assert!(decide(&format!("rate_limiter.rate_limit('x', 'internal', config => {inline})")).ok);
        assert!(!decide(&format!("rate_limiter.rate_limit('x', 'internal', config => {inline})")).ok, "limited again");
        fails("SELECT rate_limiter.allow('api', 'k', NULL)", "22023", "until must not be NULL");
        fails(&format!("SELECT rate_limiter.allow('api', '{}')", "k".repeat(1025)), "22023", "1024");
        fails("SELECT rate_limiter.allow('', 'k')", "22023", "empty");
    }

    #[pg_test]
    fn credit_gives_back_what_the_limit_still_counts_and_returns_the_state_after() {
        at("0");
        run("SELECT rate_limiter.define('llm', 'token bucket', 10000, '1 hour')");
        // Reserve the estimate, do the work, give back what was not used.
        assert_eq!(decide("rate_limiter.rate_limit('llm', 'team', 2000)").remaining, 8000.0);
        let back = decide("rate_limiter.credit('llm', 'team', 800)");
        assert_eq!((back.ok, back.granted, back.remaining, back.retry_after), (true, -800.0, 8800.0, None));
        assert_eq!(one::<String>("SELECT coalesce(reason, 'none') FROM rate_limiter.credit('llm', 'team', 0)").as_deref(), Some("none"));
        // More than was taken is clamped at the capacity, the excess discarded.
        let back = decide("rate_limiter.credit(name => 'llm', key => 'team', count => 5000)");
        assert_eq!((back.granted, back.remaining), (-1200.0, 10000.0));
        assert_eq!(decide("rate_limiter.credit('llm', 'nobody', 10)").granted, 0.0, "a full key takes nothing back");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state WHERE key = 'nobody'"), Some(0), "and writes nothing");
        // Inline configs and sharded limits (the emptiest shard looked at).
        let inline = r#"'{"kind":"fixed window","rate":5,"period":1000}'"#;
        run(&format!("SELECT rate_limiter.rate_limit('inl', 'k', 5, config => {inline})"));
        assert!(!decide(&format!("rate_limiter.rate_limit('inl', 'k', config => {inline})")).ok);
        assert_eq!(decide(&format!("rate_limiter.credit('inl', 'k', 2, config => {inline})")).granted, -2.0);
        assert!(decide(&format!("rate_limiter.rate_limit('inl', 'k', 2, config => {inline})")).ok);
        // Every shard emptied: the credit fills one of them, the rest discarded (Convex).
        run("SELECT rate_limiter.define('wide', 'token bucket', 40, '1 hour', shards => 4)");
        run("SELECT rate_limiter.rate_limit('wide', 'k') FROM generate_series(1, 60)");
        assert_eq!(one::<f64>("SELECT sum(value) FROM rate_limiter.state WHERE name = 'wide'"), Some(0.0));
        assert_eq!(decide("rate_limiter.credit('wide', 'k', 100)").granted, -10.0, "one shard's capacity");
        // Counts are checked as rate_limit checks them; rate_limit still refuses negatives.
        fails("SELECT rate_limiter.credit('llm', 'team', -1)", "22023", "count must be a finite number >= 0");
        fails("SELECT rate_limiter.credit('llm', 'team', NULL)", "22023", "must not be NULL");
        fails("SELECT rate_limiter.credit('llm', 'team', 'NaN')", "22023", "finite");
        fails("SELECT rate_limiter.rate_limit('llm', 'team', -1)", "22023", "count must be a finite number >= 0");
        fails("SELECT rate_limiter.credit('undefined', 'k')", "42704", "does not exist");
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
        // A jsonb argument past 1 MB is refused before it becomes Rust values (whose allocation
        // failing would abort the backend); toasted, it is measured without detoasting.
        let huge = r#"jsonb_build_object('kind', 'token bucket', 'rate', 1, 'period', 1, 'x', repeat('y', 2000000))"#;
        fails(&format!("SELECT rate_limiter.rate_limit('x', config => {huge})"), "22023", "more than 1048576");
        fails(&format!("SELECT rate_limiter.rate_limit_all(jsonb_build_array({huge}))"), "22023", "more than 1048576");
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
            "SELECT ts > '{T0}'::timestamptz - interval '1 day 1 second' AND ts <= '{T0}' FROM rate_limiter.state WHERE {}",
            inline_rows("late")
        ));
        assert_eq!(aligned, Some(true));
        run("DELETE FROM rate_limiter.state");
        fails("SELECT rate_limiter.define('d', 'fixed window', 1, '1 second', start => 'infinity')", "22008", "start");
        // A window so long that its start or end would fall outside what PostgreSQL can store
        // is refused by the bound on periods (100 years) since 0.5.0.
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"fixed window","rate":1,"period":1e19}')"#, "22023", "period must be between");
        run("SET rate_limiter.fake_now = 'infinity'");
        fails(r#"SELECT rate_limiter.rate_limit('x', config => '{"kind":"token bucket","rate":1,"period":1}')"#, "22008", "fake_now");
        run("SET rate_limiter.fake_now = '-infinity'");
        fails(r#"SELECT rate_limiter.check_rate_limit('x', config => '{"kind":"token bucket","rate":1,"period":1}')"#, "22008", "fake_now");
        at("0");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state"), Some(0));
        // Every stored instant stays printable.
        run(r#"SELECT rate_limiter.rate_limit('far', config => '{"kind":"fixed window","rate":1,"period":"100 years"}')"#);
        assert_eq!(one::<bool>("SELECT bool_and(isfinite(ts) AND ts::text <> '') FROM rate_limiter.state"), Some(true));
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
    fn functions_are_volatile_parallel_unsafe_and_private() {
        // Only the header formatters are STABLE (they read configs, write nothing) and
        // PARALLEL RESTRICTED (they use the backend's config cache); the statistics'
        // functions are VOLATILE and PARALLEL RESTRICTED (their NOTICE is the leader's);
        // ip_key is arithmetic on its arguments: IMMUTABLE, PARALLEL SAFE.
        let wrong = one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'rate_limiter'::regnamespace
               AND (provolatile, proparallel) <> CASE
                   WHEN proname LIKE 'http_headers%' THEN ('s'::\"char\", 'r'::\"char\")
                   WHEN proname IN ('_stats', '_top_denied', 'stats_reset', 'stats_every_database',
                                    'top_denied_every_database') THEN ('v'::\"char\", 'r'::\"char\")
                   WHEN proname IN ('ip_key', 'http_problem') THEN ('i'::\"char\", 's'::\"char\")
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
