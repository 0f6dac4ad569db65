//! Overrides and tiers: a key of a named limit decided under numbers of its own or its
//! tier's, its count kept across every change, and what they refuse.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::*;

    fn take(name: &str, key: &str) -> D {
        decide(&format!("rate_limiter.rate_limit('{name}', '{key}')"))
    }

    fn admitted(name: &str, key: &str, tries: usize) -> usize {
        (0..tries).filter(|_| take(name, key).ok).count()
    }

    #[pg_test]
    fn a_key_is_decided_under_its_override_and_keeps_its_count_across_every_change() {
        at("0");
        run("SELECT rate_limiter.define('plan', 'sliding window', 2, '1 hour', start => '2026-01-01 00:00:00+00')");
        assert_eq!(admitted("plan", "free", 5), 2, "the limit's numbers");
        run("SELECT rate_limiter.override('plan', 'pro', rate => 5, note => 'plan: pro')");
        assert_eq!(admitted("plan", "pro", 10), 5, "the override's rate");
        assert_eq!(admitted("plan", "free", 5), 0, "other keys keep the limit's");
        // Moved up mid-window: the 2 taken count, so 3 more, never a fresh window of 5.
        run("SELECT rate_limiter.override('plan', 'free', rate => 5)");
        assert_eq!(admitted("plan", "free", 10), 3);
        // Moved down again: 5 taken count against 2.
        assert!(one::<bool>("SELECT rate_limiter.remove_override('plan', 'free')").unwrap());
        assert!(!one::<bool>("SELECT rate_limiter.remove_override('plan', 'free')").unwrap(), "none left");
        assert_eq!(admitted("plan", "free", 5), 0);
        let d = take("plan", "pro");
        assert_eq!((d.ok, d.remaining), (false, 0.0));
        // What the key is decided under is what rate_limit_value reports.
        let cfg = one::<pgrx::JsonB>("SELECT effective_config FROM rate_limiter.rate_limit_value('plan', 'pro')").unwrap();
        assert_eq!((cfg.0["rate"].as_f64(), cfg.0["capacity"].as_f64()), (Some(5.0), Some(5.0)));
        let cfg = one::<pgrx::JsonB>("SELECT effective_config FROM rate_limiter.rate_limit_value('plan', 'free')").unwrap();
        assert_eq!(cfg.0["rate"].as_f64(), Some(2.0));
        // Once nothing weighs, each key's numbers; several limits at once use them too.
        at("2 hours");
        assert_eq!(admitted("plan", "pro", 10), 5);
        let all = |key: &str| decide(&format!("rate_limiter.rate_limit_all('[{{\"name\": \"plan\", \"key\": \"{key}\", \"count\": 2}}]')"));
        assert!(all("free").ok);
        assert!(!all("free").ok, "2 of 2 taken");
    }

    #[pg_test]
    fn a_limit_with_more_overridden_keys_than_a_backend_keeps_probes_each_key() {
        // More keys than the per-backend list of a limit's overridden keys holds (1 MiB, a
        // key's length and 32 bytes each): each key is then probed, every override still found.
        at("0");
        run("SELECT rate_limiter.define('many', 'token bucket', 1, '1 hour')");
        let long = "repeat('k', 1019)";
        run(&format!("INSERT INTO rate_limiter.overrides (name, key, rate) SELECT 'many', {long} || g, 2 FROM generate_series(1000, 2000) g"));
        run("INSERT INTO rate_limiter.overrides (name, key, rate) VALUES ('many', 'k1', 2)");
        run("SELECT rate_limiter.override('many', NULL, rate => 3)");
        let last = one::<String>(&format!("SELECT {long} || 2000")).unwrap();
        assert_eq!(admitted("many", &last, 5), 2, "the last key's override");
        assert_eq!(admitted("many", "other", 5), 1, "a key without one");
        assert_eq!((0..5).filter(|_| decide("rate_limiter.rate_limit('many', NULL)").ok).count(), 3, "the NULL key's");
        // Back within: the list is read whole, and answers alike.
        // (A DELETE, not a TRUNCATE: other tests' defines, run alongside, read the table.)
        run("DELETE FROM rate_limiter.overrides WHERE name = 'many'");
        run("SELECT rate_limiter.override('many', 'k1', rate => 2)");
        assert_eq!(admitted("many", &last, 5), 0, "its 2 taken count against the limit's 1");
        assert_eq!(admitted("many", "k1", 5), 2);
        assert_eq!(admitted("many", "k2", 5), 1);
    }

    #[pg_test]
    fn an_override_ends_at_until_and_prune_deletes_it() {
        at("0");
        run("SELECT rate_limiter.define('boost', 'token bucket', 1, '1 hour')");
        run(&format!("SELECT rate_limiter.override('boost', 'k', rate => 3, until => '{T0}'::timestamptz + interval '10 minutes')"));
        assert_eq!(admitted("boost", "k", 5), 3, "boosted");
        at("10 minutes");
        // Under the limit again: 3 taken against a capacity of 1, refilled by a sixth.
        assert_eq!(admitted("boost", "k", 5), 0);
        assert_eq!(one::<i64>("SELECT rate_limiter.prune()"), Some(1), "the ended override");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.overrides"), Some(0));
    }

    #[pg_test]
    fn an_exempt_key_is_let_through_without_its_state() {
        at("0");
        run("SELECT rate_limiter.define('ex', 'token bucket', 1, '1 hour')");
        run("SELECT rate_limiter.override('ex', 'svc', exempt => true)");
        let reason = one::<String>("SELECT reason FROM rate_limiter.rate_limit('ex', 'svc', 1)");
        assert_eq!(reason.as_deref(), Some("allowed"));
        assert_eq!(admitted("ex", "svc", 5), 5);
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state WHERE name = 'ex'"), Some(0), "never read or written");
        // A block wins, as over an allow.
        run("SELECT rate_limiter.block('ex', 'svc')");
        assert_eq!(one::<String>("SELECT reason FROM rate_limiter.rate_limit('ex', 'svc')").as_deref(), Some("blocked"));
    }

    #[pg_test]
    fn what_override_refuses_and_overrides_go_with_their_limit() {
        fails("SELECT rate_limiter.override('nope', 'k', rate => 1)", "42704", "nope");
        run("SELECT rate_limiter.define('sw', 'sliding window', 10, '1 minute')");
        fails("SELECT rate_limiter.override('sw', 'k', capacity => 20)", "22023", "capacity");
        fails("SELECT rate_limiter.override('sw', 'k', rate => 0)", "22023", "rate");
        fails("SELECT rate_limiter.override('sw', 'k', exempt => NULL)", "22023", "exempt");
        // A hot limit's override ends only by remove_override(), which folds its key's log.
        run("SELECT rate_limiter.define('h', 'token bucket', 10, '1 minute', hot => true)");
        fails("SELECT rate_limiter.override('h', 'k', rate => 20, until => now() + interval '1 hour')", "0A000", "remove_override");
        fails(
            "INSERT INTO rate_limiter.overrides (name, key, rate, until) VALUES ('h', 'k', 20, now() + interval '1 hour')",
            "0A000",
            "remove_override",
        );
        // '-infinity' is an end too: never in force, its key admitted under the limit's numbers.
        fails("SELECT rate_limiter.override('h', 'k', rate => 20, until => '-infinity')", "0A000", "remove_override");
        run("SELECT rate_limiter.override('h', 'k', rate => 20)");
        run("SELECT rate_limiter.define_tier('h', 'pro', rate => 20)");
        // A memory limit's override ends only by remove_override(), which waits for its calls.
        run("SELECT rate_limiter.define('m', 'token bucket', 10, '1 minute', durable => false)");
        fails("SELECT rate_limiter.override('m', 'k', rate => 20, until => now() + interval '1 hour')", "0A000", "remove_override");
        fails(
            "INSERT INTO rate_limiter.overrides (name, key, rate, until) VALUES ('m', 'k', 20, now() + interval '1 hour')",
            "0A000",
            "remove_override",
        );
        run("SELECT rate_limiter.override('m', 'k', rate => 20)");
        // A limit with an override that ends stays not hot.
        run("SELECT rate_limiter.override('sw', 'k', rate => 20, until => now() + interval '1 hour')");
        fails("SELECT rate_limiter.define('sw', 'sliding window', 10, '1 minute', hot => true)", "0A000", "remove_override");
        // Redefined otherwise, the override applies to the new definition's other numbers.
        run("SELECT rate_limiter.define('sw', 'fixed window', 10, '1 minute')");
        let cfg = one::<pgrx::JsonB>("SELECT effective_config FROM rate_limiter.rate_limit_value('sw', 'k')").unwrap();
        assert_eq!((cfg.0["kind"].as_str(), cfg.0["rate"].as_f64()), (Some("fixed window"), Some(20.0)));
        // A redefinition its overrides or tiers no longer fit is refused, as their calls would be.
        run("SELECT rate_limiter.define('fit', 'token bucket', 10, '1 minute')");
        run("SELECT rate_limiter.override('fit', 'k', capacity => 20)");
        fails("SELECT rate_limiter.define('fit', 'sliding window', 10, '1 minute')", "22023", "capacity");
        run("SELECT rate_limiter.override('fit', 'k', min_gap => '1 second')");
        fails("SELECT rate_limiter.define('fit', 'token bucket', 10, '1 minute', hot => true)", "0A000", "a hot limit with");
        run("SELECT rate_limiter.remove_override('fit', 'k')");
        run("SELECT rate_limiter.define_tier('fit', 'pro', capacity => 20)");
        fails("SELECT rate_limiter.define('fit', 'sliding window', 10, '1 minute')", "22023", "capacity");
        run("SELECT rate_limiter.remove_tier('fit', 'pro')");
        run("SELECT rate_limiter.define('fit', 'sliding window', 10, '1 minute')");
        run("DELETE FROM rate_limiter.limits WHERE name = 'sw'");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.overrides WHERE name = 'sw'"), Some(0), "gone with it");
        run("SELECT rate_limiter.define('sw', 'sliding window', 10, '1 minute')");
        let cfg = one::<pgrx::JsonB>("SELECT effective_config FROM rate_limiter.rate_limit_value('sw', 'k')").unwrap();
        assert_eq!(cfg.0["rate"].as_f64(), Some(10.0), "a limit defined again has none");
    }

    /// A change of a key's numbers counts what it took as a redefinition of the limit does
    /// (a lowered window counts what the higher rate took), for every kind: the same calls on
    /// a key moved by overrides and on a limit redefined by `define` answer alike.
    #[pg_test]
    fn an_override_changes_a_keys_numbers_as_a_redefinition_changes_the_limits() {
        at("0");
        for kind in ["sliding window", "rolling window", "token bucket", "fixed window"] {
            let (by_override, by_define) = (format!("o_{}", kind.replace(' ', "_")), format!("d_{}", kind.replace(' ', "_")));
            let define = |name: &str, rate: u32| run(&format!("SELECT rate_limiter.define('{name}', '{kind}', {rate}, '1 hour')"));
            define(&by_override, 10);
            run(&format!("SELECT rate_limiter.override('{by_override}', 'k', rate => 100)"));
            define(&by_define, 100);
            let both = |tries: usize| (admitted(&by_override, "k", tries), admitted(&by_define, "k", tries));
            assert_eq!(both(30), (30, 30), "{kind}");
            run(&format!("SELECT rate_limiter.override('{by_override}', 'k', rate => 20)"));
            define(&by_define, 20);
            let lowered = both(30);
            assert_eq!(lowered.0, lowered.1, "{kind}: lowered");
            at("30 minutes");
            run(&format!("SELECT rate_limiter.remove_override('{by_override}', 'k')"));
            define(&by_define, 10);
            let back = both(30);
            assert_eq!(back.0, back.1, "{kind}: back to the limit's");
            at("0");
        }
        // The windows that count what was taken admit nothing more after the change.
        run("SELECT rate_limiter.override('o_sliding_window', 'z', rate => 100)");
        assert_eq!(admitted("o_sliding_window", "z", 30), 30);
        run("SELECT rate_limiter.override('o_sliding_window', 'z', rate => 20)");
        assert_eq!(admitted("o_sliding_window", "z", 30), 0, "30 taken count against 20");
    }

    #[pg_test]
    fn a_tier_gives_its_keys_its_numbers_and_a_change_of_it_reaches_them_all() {
        at("0");
        run("SELECT rate_limiter.define('t', 'sliding window', 1, '1 hour', start => '2026-01-01 00:00:00+00')");
        run("SELECT rate_limiter.define_tier('t', 'pro', rate => 3, note => 'plan: pro')");
        run("SELECT rate_limiter.override('t', 'a', tier => 'pro')");
        run("SELECT rate_limiter.override('t', 'b', tier => 'pro')");
        // Before this transaction calls a limit: a TRUNCATE waits for other tests' defines, which
        // may wait for the callers (hold_calls_off).
        fails("TRUNCATE rate_limiter.tiers", "0A000", "TRUNCATE");
        assert_eq!(admitted("t", "a", 5), 3);
        assert_eq!(admitted("t", "b", 1), 1);
        assert_eq!(admitted("t", "c", 5), 1, "no tier: the limit's numbers");
        // One row changes every key of the tier, each with its count kept.
        run("SELECT rate_limiter.define_tier('t', 'pro', rate => 5)");
        assert_eq!(admitted("t", "a", 5), 2, "3 taken count against 5");
        assert_eq!(admitted("t", "b", 9), 4);
        fails("SELECT rate_limiter.override('t', 'a', tier => 'gold')", "42704", "gold");
        fails("SELECT rate_limiter.override('t', 'a', tier => 'pro', rate => 9)", "22023", "not both");
        fails("SELECT rate_limiter.define_tier('t', 'big', capacity => 9)", "22023", "capacity");
        fails("SELECT rate_limiter.define_tier('nope', 'pro', rate => 9)", "42704", "nope");
        // A tier a key is in stays, however it is asked to go.
        fails("SELECT rate_limiter.remove_tier('t', 'pro')", "23503", "2 override");
        fails("DELETE FROM rate_limiter.tiers WHERE tier = 'pro'", "23503", "pro");
        fails("UPDATE rate_limiter.tiers SET tier = 'gold' WHERE tier = 'pro'", "23503", "pro");
        run("SELECT rate_limiter.override('t', 'a', rate => 1)");
        run("SELECT rate_limiter.remove_override('t', 'b')");
        assert!(one::<bool>("SELECT rate_limiter.remove_tier('t', 'pro')").unwrap());
        assert!(!one::<bool>("SELECT rate_limiter.remove_tier('t', 'pro')").unwrap(), "none left");
        // A tier may exempt its keys.
        run("SELECT rate_limiter.define_tier('t', 'staff', exempt => true)");
        run("SELECT rate_limiter.override('t', 'c', tier => 'staff')");
        assert_eq!(one::<String>("SELECT reason FROM rate_limiter.rate_limit('t', 'c')").as_deref(), Some("allowed"));
        // Tiers go with their limit, after the overrides that name them.
        run("DELETE FROM rate_limiter.limits WHERE name = 't'");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.tiers WHERE name = 't'"), Some(0));
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.overrides WHERE name = 't'"), Some(0));
    }

    /// Issue 64: a plan changed mid-window keeps what the key used, on every kind: raised
    /// from 3 to 10 after 3 taken, 7 more (0.7.0 gave a token bucket and a fixed window 0); a
    /// tier raised from 5 to 8 after 5 taken, 3 more (0.7.0: 0); an override of 6 that ends
    /// after 4 were taken under a limit of 2, none (0.7.0: 2 for a token bucket and a fixed
    /// window); a limit redefined from 3 to 5 after 3 taken, 2 more.
    #[pg_test]
    fn a_plan_changed_mid_window_keeps_what_the_key_used_on_every_kind() {
        for kind in ["token bucket", "fixed window", "sliding window", "rolling window"] {
            at("0");
            let start = if kind == "token bucket" { "" } else { ", start => '2026-01-01 00:00:00+00'" };
            let def = |name: &str, rate: u32| run(&format!("SELECT rate_limiter.define('{name}', '{kind}', {rate}, '1 hour'{start})"));
            def("raised", 3);
            assert_eq!(admitted("raised", "k", 4), 3, "{kind}");
            run("SELECT rate_limiter.override('raised', 'k', rate => 10)");
            if kind == "token bucket" || kind == "fixed window" {
                let value = one::<f64>("SELECT value FROM rate_limiter.rate_limit_value('raised', 'k')");
                assert_eq!(value, Some(7.0), "{kind}: rate_limit_value reads it as a call does");
            }
            assert_eq!(admitted("raised", "k", 10), 7, "{kind}: raised from 3 to 10 after 3 taken");
            def("tiered", 1);
            run("SELECT rate_limiter.define_tier('tiered', 'pro', rate => 5)");
            run("SELECT rate_limiter.override('tiered', 'k', tier => 'pro')");
            assert_eq!(admitted("tiered", "k", 6), 5, "{kind}");
            run("SELECT rate_limiter.define_tier('tiered', 'pro', rate => 8)");
            assert_eq!(admitted("tiered", "k", 5), 3, "{kind}: a tier raised from 5 to 8 after 5 taken");
            def("ending", 2);
            run("SELECT rate_limiter.override('ending', 'k', rate => 6, until => '2026-01-01 00:00:30+00')");
            assert_eq!(admitted("ending", "k", 4), 4, "{kind}");
            at("1 minute");
            assert_eq!(admitted("ending", "k", 3), 0, "{kind}: an override of 6 ended after 4 taken, under a limit of 2");
            // Under the override, the row was full again 40 minutes on; under the limit's 2 an
            // hour the key still owes then: the denials wrote it with that expiry, so prune()
            // keeps it.
            at("41 minutes");
            run("SELECT rate_limiter.prune()");
            assert_eq!(admitted("ending", "k", 1), 0, "{kind}: still owed after a prune");
            at("0");
            def("redefined", 3);
            assert_eq!(admitted("redefined", "k", 4), 3, "{kind}");
            def("redefined", 5);
            assert_eq!(admitted("redefined", "k", 5), 2, "{kind}: redefined from 3 to 5 after 3 taken");
            // Lowered below what was used: none until the window ends or the bucket refills.
            def("redefined", 1);
            assert_eq!(admitted("redefined", "k", 2), 0, "{kind}: lowered to 1 after 5 taken");
            for name in ["raised", "tiered", "ending", "redefined"] {
                run(&format!("DELETE FROM rate_limiter.limits WHERE name = '{name}'"));
                run(&format!("DELETE FROM rate_limiter.state WHERE name = '{name}'"));
            }
        }
    }

    /// Issue 64, F2: an override of a concurrency limit with an end ended without waiting for
    /// the slots it allowed (a boost from 2 to 4 ended: 4 holders under a limit of 2). Such an
    /// end is refused, as a hot or memory limit's is, and so is a limit with such overrides
    /// redefined as a concurrency limit, and a direct INSERT of one.
    #[pg_test]
    fn a_concurrency_limits_override_takes_no_end() {
        run("SELECT rate_limiter.define('pool', 'concurrency', 2, '1 minute')");
        fails("SELECT rate_limiter.override('pool', 'k', rate => 4, until => now() + interval '1 hour')", "0A000", "concurrency limit \"pool\" with an end");
        fails("INSERT INTO rate_limiter.overrides (name, key, rate, until) VALUES ('pool', 'k', 4, now() + interval '1 hour')", "0A000", "with an end");
        run("SELECT rate_limiter.override('pool', 'k', rate => 4)");
        run("SELECT rate_limiter.define('boosted', 'token bucket', 2, '1 minute')");
        run("SELECT rate_limiter.override('boosted', 'k', rate => 4, until => now() + interval '1 hour')");
        fails("SELECT rate_limiter.define('boosted', 'concurrency', 2, '1 minute')", "0A000", "overrides with an end");
    }
}
