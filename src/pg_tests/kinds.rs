//! The kinds through SQL beyond contract/vectors.json's inline calls (src/pg_tests/vectors.rs):
//! named limits, refusals of a definition, rows written, sharding, redefinitions, calendars.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::*;

    /// Seed every shard of the NULL key of `name` under the inline config `config` (a SQL
    /// literal) with `value(shard)` at T0: rows named by the config's fingerprint, with shard
    /// numbers -1 - shard.
    fn seed(name: &str, config: &str, shards: i32, value: impl Fn(i32) -> f64) {
        run(&format!("DELETE FROM rate_limiter.state WHERE {}", inline_rows(name)));
        for shard in 0..shards {
            run(&format!(
                "INSERT INTO rate_limiter.state VALUES ('{}', NULL, -1 - {shard}, {}, '{T0}', 'infinity')",
                inline_name(name, config),
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
                .select(&format!("SELECT -1 - shard, value FROM rate_limiter.state WHERE {}", inline_rows(name)), None, &[])
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

    /// The issue's vector through SQL with a named limit (contract/vectors.json has it
    /// inline), and what a sliding window refuses.
    #[pg_test]
    fn sliding_window_vector_and_refusals() {
        run(&format!("SELECT rate_limiter.define('sw', 'sliding window', 10, '1 minute', start => '{T0}')"));
        let take = |count: u32| decide(&format!("rate_limiter.rate_limit('sw', 'k', {count})"));
        at("30 seconds");
        assert_eq!(take(4), D { ok: true, retry_after: None, remaining: 6.0, reset_after: 90_000.0, granted: 4.0 });
        at("75 seconds");
        let five = take(5);
        assert_eq!((five.ok, five.remaining), (true, 2.0), "4 * 3/4 + 5 weigh");
        assert_eq!(take(2).remaining, 0.0);
        assert_eq!(take(1), D { ok: false, retry_after: Some(15_000.0), remaining: 0.0, reset_after: 105_000.0, granted: 0.0 });
        assert_eq!(take(0).granted, 0.0, "count 0 is answered");
        at("90 seconds");
        assert!(take(1).ok);
        let (value, ts) =
            Spi::get_two::<f64, String>("SELECT value, ts::text FROM rate_limiter.rate_limit_value('sw', 'k')").unwrap();
        assert_eq!((value, ts.as_deref()), (Some(2.0), Some("2026-01-01 00:01:00+00")), "10 - 8 in this window");
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

    /// Issue 31: 0.4.0 kept only what was left of the rate, so a lower rate read it as
    /// negative use (99 calls admitted at a rate of 10 in the window of one).
    #[pg_test]
    fn a_lowered_sliding_window_rate_counts_what_the_higher_one_took() {
        at("0 seconds");
        run("SELECT rate_limiter.define('lowered', 'sliding window', 100, '1 hour')");
        assert!(decide("rate_limiter.rate_limit('lowered', 'k')").ok);
        run("SELECT rate_limiter.define('lowered', 'sliding window', 10, '1 hour')");
        let admitted = (0..100).filter(|_| decide("rate_limiter.rate_limit('lowered', 'k')").ok).count();
        assert_eq!(admitted, 9, "10 in the window, one of them taken under the rate of 100");
        // Raised again: the 10 taken are still taken.
        run("SELECT rate_limiter.define('lowered', 'sliding window', 100, '1 hour')");
        assert_eq!(decide("rate_limiter.check_rate_limit('lowered', 'k', 0)").remaining, 90.0);
    }

    /// Issue 31: a role with EXECUTE on credit, bringing its own inline config of a rate of a
    /// million, gave back a million tokens of a limit whose calls took 5 (0.4.0 answered
    /// granted = -1000000 and the application's own config then admitted 5,000 of 5,000).
    /// Each inline config now has a state of its own: the other config's credit finds
    /// nothing it took, and a credit under the application's config gives back what it took.
    #[pg_test]
    fn a_credit_under_another_inline_config_gives_back_nothing_of_the_applications() {
        at("0 seconds");
        for kind in ["sliding window", "rolling window", "token bucket", "fixed window"] {
            let key = kind.replace(' ', "_");
            let app = format!(r#"'{{"kind": "{kind}", "rate": 10, "period": 60000}}'"#);
            let other = format!(r#"'{{"kind": "{kind}", "rate": 1000000, "period": 60000}}'"#);
            assert!(decide(&format!("rate_limiter.rate_limit('api', '{key}', 5, config => {app})")).ok);
            let credited = decide(&format!("rate_limiter.credit('api', '{key}', 1000000, config => {other})"));
            assert_eq!(credited.granted, 0.0, "{kind}: nothing taken under that config");
            let admitted = |n| (0..n).filter(|_| decide(&format!("rate_limiter.rate_limit('api', '{key}', config => {app})")).ok).count();
            assert_eq!(admitted(100), 5, "{kind}: the window's rate, no more");
            let back = decide(&format!("rate_limiter.credit('api', '{key}', 1000000, config => {app})"));
            assert_eq!(back.granted, -10.0, "{kind}: what the application's calls took, no more");
            assert_eq!(admitted(100), 10, "{kind}");
        }
    }

    /// Issue 31: a caller with a looser inline config for the same (name, key) took the
    /// application's state to its own bound: an exhausted token bucket of 10 a minute, refilled
    /// at a million a minute for one second, let the application's config through 10 times.
    #[pg_test]
    fn a_call_under_a_looser_inline_config_leaves_the_applications_state_alone() {
        at("0 seconds");
        let app = r#"'{"kind": "token bucket", "rate": 10, "period": 60000}'"#;
        let loose = r#"'{"kind": "token bucket", "rate": 1000000, "period": 60000, "capacity": 1000000}'"#;
        let admitted = |config: &str| {
            (0..20).filter(|_| decide(&format!("rate_limiter.rate_limit('api', 'carol', config => {config})")).ok).count()
        };
        assert_eq!(admitted(app), 10);
        at("1 second");
        assert_eq!(admitted(loose), 20, "its own bucket");
        assert_eq!(admitted(app), 0, "a sixth of a token refilled in a second");
        let value = |config: &str| {
            one::<f64>(&format!("SELECT value FROM rate_limiter.rate_limit_value('api', 'carol', config => {config})")).unwrap()
        };
        assert!(value(app) < 1.0 && value(loose) > 999_000.0, "each config reads its own row");
        // The fingerprint is the config's arithmetic with its defaults, however it is spelled;
        // how a call waits or is answered is not part of it.
        let same = r#"'{"period": "1 minute", "capacity": 10, "rate": 10, "kind": "token bucket", "lockTimeout": 100, "denyCache": "1 second"}'"#;
        assert_eq!(admitted(same), 0, "the application's own bucket");
        assert_eq!(
            one::<i64>("SELECT count(*) FROM rate_limiter.state WHERE key = 'carol'"),
            Some(2),
            "one row per config"
        );
        let part = |config: &str| format!(r#"'[{{"name": "api", "key": "carol", "config": {}}}]'"#, &config[1..config.len() - 1]);
        assert!(!decide(&format!("rate_limiter.rate_limit_all({})", part(app))).ok, "rate_limit_all reaches the same row");
        assert!(decide(&format!("rate_limiter.rate_limit_all({})", part(loose))).ok);
        // A reset forgets (name, key) under every config, and the named limit's too.
        run("SELECT rate_limiter.define('api', 'token bucket', 1, '1 hour')");
        assert!(decide("rate_limiter.rate_limit('api', 'carol')").ok);
        run("SELECT rate_limiter.reset_rate_limit('api', 'carol')");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state WHERE key = 'carol'"), Some(0));
        assert_eq!(admitted(app), 10);
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
        // contract/vectors.json has a partial fixed window with a gap, inline.
        let inline = format!(
            r#"'{{"kind":"fixed window","rate":10,"period":"1 minute","start":"{T0}","minGap":"1 second","mode":"partial"}}'"#
        );
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
        let size = one::<i32>(&format!("SELECT pg_column_size(s.*) FROM rate_limiter.state s WHERE {}", inline_rows(&name)));
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

    /// A sharded rolling window never passes its rate (contract/vectors.json has the
    /// boundary instants of the window kinds).
    #[pg_test]
    fn a_sharded_rolling_window_never_passes_its_rate() {
        // Sharded rolling window: 2 shards of 5; the sum never exceeds the rate.
        let sharded = r#"'{"kind":"rolling window","rate":10,"period":"1 hour","shards":2}'"#;
        let granted: f64 = (0..40).map(|_| decide(&format!("rate_limiter.rate_limit('rws', config => {sharded})")).granted).sum();
        assert_eq!(granted, 10.0);
    }

    /// The Convex component's sharding cases, for 1 to 4 shards.
    #[pg_test]
    fn sharding_convex_cases() {
        at("0");
        for shards in 1..=4 {
            let cfg = sharded_config(shards, "");
            let call = |extra: &str| decide(&format!("rate_limiter.rate_limit('s', config => {cfg}{extra})"));

            // Success when all shards have enough: one shard pays.
            seed("s", &cfg, shards, |_| 1.0);
            let d = call("");
            assert_eq!((d.ok, d.retry_after), (true, None), "{shards} shards");
            assert_eq!(shard_changes("s", |_| 1.0), (f64::from(shards) - 1.0, 1));

            // Unbounded reservations work.
            seed("s", &cfg, shards, |_| 0.0);
            let d = call(", reserve => true");
            assert!(d.ok && d.retry_after.unwrap() >= 1000.0, "{shards}: {d:?}");
            assert_eq!(shard_changes("s", |_| 0.0), (-1.0, 1));

            // Failure when no shard has enough, with throws.
            fails(&format!("SELECT rate_limiter.rate_limit('s', throws => true, config => {cfg})"), "RL429", "exceeded");
            assert_eq!(shard_changes("s", |_| 0.0), (-1.0, 1), "the failed call wrote nothing");

            // Success when at least one of the two has enough.
            let third_short = |shard: i32| if shard == 2 { -1.0 } else { 1.0 };
            seed("s", &cfg, shards, third_short);
            let d = call("");
            assert_eq!((d.ok, d.retry_after), (true, None), "{shards} shards");
            assert_eq!(shard_changes("s", third_short).1, 1);

            // Reservations fail when maxed out.
            let capped = sharded_config(shards, r#","maxReserved":1"#);
            seed("s", &capped, shards, |_| 1.0);
            let d = decide(&format!("rate_limiter.rate_limit('s', count => 3, reserve => true, config => {capped})"));
            assert!(!d.ok && d.retry_after.unwrap() >= 1000.0, "{shards}: {d:?}");
            assert_eq!(shard_changes("s", |_| 1.0), (f64::from(shards), 0));

            // Reservations work if one of the shards has capacity.
            let cfg_rate = format!(
                r#"'{{"kind":"token bucket","rate":{shards},"period":1000,"shards":{shards},"capacity":{},"maxReserved":{shards}}}'"#,
                10 * shards
            );
            seed("s", &cfg_rate, shards, third_short);
            let d = decide(&format!("rate_limiter.rate_limit('s', count => 2, reserve => true, config => {cfg_rate})"));
            assert_eq!((d.ok, d.retry_after), (true, Some(1000.0)), "{shards} shards");
            assert_eq!(shard_changes("s", third_short).1, 1);

            // From 3 shards: two half-full shards together serve one token and end level.
            if shards >= 3 {
                seed("s", &cfg, shards, |_| 0.5);
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
        assert_eq!(one::<i64>(&format!("SELECT count(*) FROM rate_limiter.state WHERE {} AND value = 0", inline_rows("sh"))), Some(2));
        // Sampling every shard reports the fullest: a full one (fresh shards are full).
        let fullest = one::<f64>(&format!("SELECT value FROM rate_limiter.rate_limit_value('sh', config => {cfg}, sample_shards => 4)"));
        assert_eq!(fullest, Some(10.0));
        run("SELECT rate_limiter.reset_rate_limit('sh')");
        assert_eq!(one::<i64>(&format!("SELECT count(*) FROM rate_limiter.state WHERE {}", inline_rows("sh"))), Some(0));
    }

    /// Issue 32: shadow mode answers a would-be denial ok, with reason 'shadow' and the real
    /// retry_after, and takes nothing: the same limit enforced afterwards still denies.
    #[pg_test]
    fn shadow_mode_lets_a_denial_through_taking_nothing() {
        at("0");
        let shadow = r#"'{"kind": "token bucket", "rate": 2, "period": "1 hour", "enforce": false}'"#;
        let enforced = r#"'{"kind": "token bucket", "rate": 2, "period": "1 hour"}'"#;
        let reason = |call: &str| one::<String>(&format!("SELECT reason FROM {call}"));
        let call = |config: &str| format!("rate_limiter.rate_limit('sm', 'k', config => {config})");
        assert!(decide(&call(shadow)).ok && decide(&call(shadow)).ok);
        let d = decide(&call(shadow));
        assert_eq!((d.ok, d.granted, d.remaining), (true, 0.0, 0.0), "{d:?}");
        assert_eq!(d.retry_after.map(f64::round), Some(1_800_000.0), "the real wait for a token");
        assert_eq!(reason(&call(shadow)).as_deref(), Some("shadow"));
        assert_eq!(reason(&format!("rate_limiter.check_rate_limit('sm', 'k', config => {shadow})")).as_deref(), Some("shadow"));
        // enforce is not part of the config's arithmetic: one state, and nothing more was taken.
        let value = one::<f64>(&format!("SELECT value FROM rate_limiter.rate_limit_value('sm', 'k', config => {enforced})"));
        assert_eq!(value, Some(0.0));
        assert!(!decide(&call(enforced)).ok);
        // throws => true raises nothing for it; a block still blocks.
        assert!(decide(&format!("rate_limiter.rate_limit('sm', 'k', throws => true, config => {shadow})")).ok);
        run("SELECT rate_limiter.block('sm', 'k')");
        assert_eq!(reason(&call(shadow)).as_deref(), Some("blocked"));
        assert!(!decide(&call(shadow)).ok);
        // The effective config says so.
        let cfg = one::<pgrx::JsonB>(&format!("SELECT effective_config FROM rate_limiter.rate_limit_value('sm', config => {shadow})"));
        assert_eq!(cfg.unwrap().0["enforce"], false);
        fails(&format!(r#"SELECT rate_limiter.rate_limit_all('[{{"name": "sm", "config": {}}}]')"#, &shadow[1..shadow.len() - 1]), "0A000", "shadow limit");
        fails(r#"SELECT rate_limiter.rate_limit('sm', config => '{"kind": "token bucket", "rate": 1, "period": 1, "enforce": 0}')"#, "22P02", "must be a boolean");
    }

    /// Issue 32: `define(..., enforce => false)` puts a named limit in shadow mode until it is
    /// defined again enforced.
    #[pg_test]
    fn a_named_limit_defined_with_enforce_false_is_in_shadow_mode() {
        at("0");
        run("SELECT rate_limiter.define('sd', 'token bucket', 1, '1 hour', enforce => false)");
        assert_eq!(one::<bool>("SELECT enforce FROM rate_limiter.limits WHERE name = 'sd'"), Some(false));
        assert!(decide("rate_limiter.rate_limit('sd', 'k')").ok);
        let d = decide("rate_limiter.rate_limit('sd', 'k')");
        assert!(d.ok && d.granted == 0.0, "{d:?}");
        assert_eq!(one::<String>("SELECT reason FROM rate_limiter.rate_limit('sd', 'k')").as_deref(), Some("shadow"));
        fails(r#"SELECT rate_limiter.rate_limit_all('[{"name": "sd", "key": "k"}]')"#, "0A000", "shadow limit");
        run("SELECT rate_limiter.define('sd', 'token bucket', 1, '1 hour')");
        assert!(!decide("rate_limiter.rate_limit('sd', 'k')").ok, "enforced again: the one token taken is taken");
    }

    /// Issue 32: `SET rate_limiter.shadow = on` puts every limit of the session in shadow mode,
    /// rate_limit_all's too, until it is reset.
    #[pg_test]
    fn the_session_setting_puts_every_limit_in_shadow_mode() {
        at("0");
        run("SELECT rate_limiter.define('ss', 'fixed window', 1, '1 hour', start => '2026-01-01')");
        assert!(decide("rate_limiter.rate_limit('ss', 'k')").ok);
        assert!(!decide("rate_limiter.rate_limit('ss', 'k')").ok);
        run("SET LOCAL rate_limiter.shadow = on");
        let d = decide("rate_limiter.rate_limit('ss', 'k')");
        assert_eq!((d.ok, d.granted, d.retry_after), (true, 0.0, Some(3_600_000.0)));
        let all = r#"rate_limiter.rate_limit_all('[{"name": "ss", "key": "k"}, {"name": "ss", "key": "other"}]')"#;
        assert_eq!(one::<String>(&format!("SELECT reason || '/' || ok || '/' || granted FROM {all}")).as_deref(), Some("shadow/true/0"));
        // All or nothing: the key that had room took nothing either.
        assert_eq!(decide("rate_limiter.check_rate_limit('ss', 'other', 0)").remaining, 1.0);
        assert!(decide("rate_limiter.rate_limit('ss', 'other')").ok);
        run("SET LOCAL rate_limiter.shadow = off");
        assert!(!decide("rate_limiter.rate_limit('ss', 'k')").ok);
    }

    /// Issue 32: a fixed window of a month, a day or a week starts its windows on the calendar
    /// (0.4.0 made '1 month' a window of 30 days from a phase of its own), in UTC or `tz`.
    #[pg_test]
    fn calendar_windows_begin_on_the_first_at_midnight_and_on_monday() {
        let set = |at: &str| run(&format!("SET LOCAL rate_limiter.fake_now = '{at}'"));
        let wait = |call: &str| decide(call).retry_after.map(|ms| (ms / 1000.0).round());
        set("2026-01-31 12:00:00+00");
        run("SELECT rate_limiter.define('monthly', 'fixed window', 5, '1 month')");
        assert_eq!((0..10).filter(|_| decide("rate_limiter.rate_limit('monthly', 'k')").ok).count(), 5);
        assert_eq!(wait("rate_limiter.rate_limit('monthly', 'k')"), Some(12.0 * 3600.0), "until February 1st");
        assert_eq!(
            one::<String>("SELECT ts::text FROM rate_limiter.rate_limit_value('monthly', 'k')").as_deref(),
            Some("2026-01-01 00:00:00+00")
        );
        set("2026-02-01 00:00:00+00");
        assert!(decide("rate_limiter.rate_limit('monthly', 'k')").ok, "a new month");
        // February of a leap year ends on the 29th; an anchor on the 31st comes back in March.
        run("SELECT rate_limiter.define('billing', 'fixed window', 1, '1 month', start => '2028-01-31 00:00+00')");
        set("2028-02-15 00:00:00+00");
        assert!(decide("rate_limiter.rate_limit('billing', 'k')").ok);
        assert_eq!(wait("rate_limiter.rate_limit('billing', 'k')"), Some(14.0 * 86_400.0), "until February 29th");
        set("2028-03-15 00:00:00+00");
        assert!(decide("rate_limiter.rate_limit('billing', 'k')").ok);
        assert_eq!(wait("rate_limiter.rate_limit('billing', 'k')"), Some(16.0 * 86_400.0), "until March 31st");
        // ISO weeks start on Monday: 2026-11-25 is a Wednesday.
        set("2026-11-25 12:00:00+00");
        run("SELECT rate_limiter.define('weekly', 'fixed window', 1, '1 week')");
        assert!(decide("rate_limiter.rate_limit('weekly', 'k')").ok);
        assert_eq!(wait("rate_limiter.rate_limit('weekly', 'k')"), Some(4.5 * 86_400.0));
        // '30 days' stays a fixed length.
        run("SELECT rate_limiter.define('thirty', 'fixed window', 1, '30 days', start => '2026-01-01 00:00+00')");
        set("2026-01-31 12:00:00+00");
        assert!(decide("rate_limiter.rate_limit('thirty', 'k')").ok);
        assert_eq!(wait("rate_limiter.rate_limit('thirty', 'k')"), Some(29.5 * 86_400.0), "until March 2nd");
        let cfg = one::<pgrx::JsonB>("SELECT effective_config FROM rate_limiter.rate_limit_value('monthly')").unwrap().0;
        assert_eq!(cfg["period"], "1 month", "passed back, still a calendar month");
    }

    /// Issue 32: a calendar day in a time zone is 23 or 25 hours across a change of offset,
    /// in Berlin (spring) and New York (autumn).
    #[pg_test]
    fn calendar_days_follow_the_time_zone_across_daylight_saving_changes() {
        let set = |at: &str| run(&format!("SET LOCAL rate_limiter.fake_now = '{at}'"));
        let wait = |call: &str| decide(call).retry_after.map(|ms| (ms / 1000.0).round());
        run("SELECT rate_limiter.define('berlin', 'fixed window', 1, '1 day', tz => 'Europe/Berlin')");
        set("2026-03-29 12:00:00+00");
        assert!(decide("rate_limiter.rate_limit('berlin', 'k')").ok);
        assert_eq!(wait("rate_limiter.rate_limit('berlin', 'k')"), Some(10.0 * 3600.0), "midnight CEST is 22:00 UTC");
        assert_eq!(
            one::<String>("SELECT ts::text FROM rate_limiter.rate_limit_value('berlin', 'k')").as_deref(),
            Some("2026-03-28 23:00:00+00"),
            "midnight CET: a day of 23 hours"
        );
        let ny = r#"'{"kind": "fixed window", "rate": 1, "period": "1 day", "tz": "America/New_York"}'"#;
        set("2026-11-01 12:00:00+00");
        assert!(decide(&format!("rate_limiter.rate_limit('ny', 'k', config => {ny})")).ok);
        assert_eq!(wait(&format!("rate_limiter.rate_limit('ny', 'k', config => {ny})")), Some(17.0 * 3600.0));
        assert_eq!(
            one::<String>(&format!("SELECT ts::text FROM rate_limiter.rate_limit_value('ny', 'k', config => {ny})")).as_deref(),
            Some("2026-11-01 04:00:00+00"),
            "midnight EDT: a day of 25 hours"
        );
        set("2026-11-02 05:00:00+00");
        assert!(decide(&format!("rate_limiter.rate_limit('ny', 'k', config => {ny})")).ok, "midnight EST");
        let cfg = one::<pgrx::JsonB>(&format!("SELECT effective_config FROM rate_limiter.rate_limit_value('ny', config => {ny})")).unwrap().0;
        assert_eq!((cfg["period"].as_str(), cfg["tz"].as_str()), (Some("1 day"), Some("America/New_York")));
    }

    /// Issue 32: a period of months where it means nothing is refused, never read as 30 days.
    #[pg_test]
    fn periods_of_months_are_refused_where_they_have_no_length() {
        at("0");
        fails("SELECT rate_limiter.define('tb', 'token bucket', 1, '1 month')", "22023", "fixed length");
        fails("SELECT rate_limiter.define('sw', 'sliding window', 1, '1 year')", "22023", "fixed length");
        fails(r#"SELECT rate_limiter.rate_limit('rw', config => '{"kind": "rolling window", "rate": 1, "period": "1 month"}')"#, "22023", "fixed length");
        fails("SELECT rate_limiter.define('fw', 'fixed window', 1, '1 month 2 days')", "22023", "whole months");
        fails("SELECT rate_limiter.define('fw', 'fixed window', 1, '1 hour', tz => 'Europe/Berlin')", "22023", "tz is for");
        fails("SELECT rate_limiter.define('fw', 'fixed window', 1, '1 day', tz => 'Mars/Olympus')", "22023", "Mars/Olympus");
        // A hot limit keeps its config in shared memory, where only UTC's calendar can be.
        fails("SELECT rate_limiter.define('hz', 'fixed window', 1, '1 day', hot => true, tz => 'Europe/Berlin')", "0A000", "hot ones are UTC");
        run("SELECT rate_limiter.define('hz', 'fixed window', 1, '1 day', hot => true)");
        // A debt of a billion billion months ends past the last instant PostgreSQL can store:
        // answered at once, the row kept (never refilled), no loop.
        let deep = r#"'{"kind": "fixed window", "rate": 0.001, "capacity": 1e15, "period": "1 month"}'"#;
        assert!(decide(&format!("rate_limiter.rate_limit('deep', 'k', 1e15, config => {deep})")).ok);
        let d = decide(&format!("rate_limiter.rate_limit('deep', 'k', 1, reserve => true, config => {deep})"));
        assert!(!d.ok, "{d:?}");
        // A name shaped as an inline config's rows' is refused: it would reach them.
        let app = r#"'{"kind": "token bucket", "rate": 1, "period": 1000}'"#;
        let stored = inline_name("login", app);
        fails(&format!("SELECT rate_limiter.rate_limit('{stored}', 'alice', config => {app})"), "22023", "is reserved");
        fails(&format!("SELECT rate_limiter.reset_rate_limit('{stored}', 'alice')"), "22023", "is reserved");
        // A token bucket of a day is 24 hours, as it was.
        run("SELECT rate_limiter.define('tb', 'token bucket', 24, '1 day')");
        assert_eq!(decide("rate_limiter.rate_limit('tb', 'k', 24)").reset_after.round(), 86_400_000.0);
    }
}
