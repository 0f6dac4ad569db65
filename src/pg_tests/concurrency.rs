//! Concurrency limits within one transaction (every `#[pg_test]` is one): slots held until
//! the transaction ends, given back by a subtransaction's abort, leases, and the refusals.
//! What crosses transactions and sessions (commit, expiry, crashes, many holders at once) is
//! in tests/test_concurrency.py.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{at, decide, fails, one, run};

    fn slots(name: &str, n: u32) {
        run(&format!("SELECT rate_limiter.define('{name}', 'concurrency', {n}, '1 second')"));
    }

    #[pg_test]
    fn a_transaction_holds_its_slots_and_the_last_free_one_is_the_last_granted() {
        at("0 s");
        slots("c1", 2);
        let first = decide("rate_limiter.rate_limit('c1', 'k')");
        assert!(first.ok && first.granted == 1.0 && first.remaining == 1.0, "{first:?}");
        assert!(decide("rate_limiter.acquire('c1', 'k')").ok);
        let denied = decide("rate_limiter.rate_limit('c1', 'k')");
        assert_eq!((denied.ok, denied.remaining, denied.granted, denied.retry_after), (false, 0.0, 0.0, Some(1000.0)));
        assert!(!decide("rate_limiter.check_rate_limit('c1', 'k')").ok);
        assert_eq!(one::<f64>("SELECT value FROM rate_limiter.rate_limit_value('c1', 'k')"), Some(0.0));
        // Another key, another set of slots.
        assert!(decide("rate_limiter.rate_limit('c1', 'other')").ok);
        assert_eq!(
            one::<String>("SELECT reason FROM rate_limiter.rate_limit('c1', 'k')").as_deref(),
            Some("exhausted")
        );
    }

    #[pg_test]
    fn a_subtransaction_that_aborts_gives_its_slots_back() {
        slots("c2", 1);
        run("DO $$ BEGIN
                 PERFORM rate_limiter.acquire('c2', 'k');
                 RAISE EXCEPTION 'undo';
             EXCEPTION WHEN raise_exception THEN NULL;
             END $$");
        assert!(decide("rate_limiter.acquire('c2', 'k')").ok, "the aborted subtransaction's slot is free");
        // One that commits hands its slot to the transaction.
        slots("c3", 1);
        run("DO $$ BEGIN PERFORM rate_limiter.acquire('c3', 'k'); EXCEPTION WHEN OTHERS THEN NULL; END $$");
        assert!(!decide("rate_limiter.acquire('c3', 'k')").ok);
    }

    #[pg_test]
    fn a_lease_holds_its_slots_under_an_id_that_release_and_renew_take() {
        at("0 s");
        slots("c4", 3);
        let id: pgrx::datum::Uuid =
            one("SELECT lease_id FROM rate_limiter.acquire('c4', 'k', 2, lease => '30 seconds')").expect("a lease id");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.leases WHERE name = 'c4'"), Some(2));
        assert_eq!(one::<f64>("SELECT remaining FROM rate_limiter.check_rate_limit('c4', 'k', 0)"), Some(1.0));
        assert_eq!(one::<bool>(&format!("SELECT rate_limiter.renew('c4', 'k', '{id}', '1 minute')")), Some(true));
        assert_eq!(
            one::<String>("SELECT (expires_at - '2026-01-01 00:00:00+00')::text FROM rate_limiter.leases WHERE name = 'c4' LIMIT 1")
                .as_deref(),
            Some("00:01:00")
        );
        assert_eq!(one::<bool>(&format!("SELECT rate_limiter.release('c4', 'other', '{id}')")), Some(false), "another key's");
        assert_eq!(one::<bool>(&format!("SELECT rate_limiter.release('c4', 'k', '{id}')")), Some(true));
        assert_eq!(one::<bool>(&format!("SELECT rate_limiter.release('c4', 'k', '{id}')")), Some(false), "once");
        assert_eq!(one::<bool>(&format!("SELECT rate_limiter.renew('c4', 'k', '{id}', '1 minute')")), Some(false));
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.leases WHERE name = 'c4'"), Some(0));
        // Without a lease, no id.
        assert_eq!(one::<bool>("SELECT lease_id IS NULL FROM rate_limiter.acquire('c4', 'j')"), Some(true));
        // Leases of each key are reset with it.
        run("SELECT rate_limiter.acquire('c4', 'r', lease => '1 hour')");
        run("SELECT rate_limiter.reset_rate_limit('c4', 'r')");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.leases WHERE name = 'c4' AND key = 'r'"), Some(0));
    }

    #[pg_test]
    fn an_inline_concurrency_config_holds_slots_of_its_own_and_its_lease_is_found_by_id() {
        let config = r#"'{"kind":"concurrency","rate":1,"period":500}'"#;
        let id: pgrx::datum::Uuid =
            one(&format!("SELECT lease_id FROM rate_limiter.acquire('c5', 'k', lease => '1 minute', config => {config})"))
                .expect("a lease id");
        let again = decide(&format!("rate_limiter.rate_limit('c5', 'k', config => {config})"));
        assert_eq!((again.ok, again.retry_after), (false, Some(500.0)));
        assert_eq!(one::<bool>(&format!("SELECT rate_limiter.release('c5', 'k', '{id}')")), Some(true));
        // Its slots are the config's rate's: another period (only a hint) reaches the same ones.
        run(&format!("SELECT rate_limiter.acquire('c5', 'j', config => {config})"));
        let other_period = r#"'{"kind":"concurrency","rate":1,"period":60000}'"#;
        assert!(!decide(&format!("rate_limiter.acquire('c5', 'j', config => {other_period})")).ok);
    }

    #[pg_test]
    fn a_null_lease_id_ends_nothing() {
        slots("c9", 1);
        assert_eq!(one::<bool>("SELECT rate_limiter.release('c9', 'k', NULL)"), Some(false));
        assert_eq!(one::<bool>("SELECT rate_limiter.renew('c9', 'k', NULL, '1 minute')"), Some(false));
    }

    #[pg_test]
    fn shadow_mode_and_allows_hold_nothing_and_blocks_deny() {
        run("SELECT rate_limiter.define('c6', 'concurrency', 1, '1 second', enforce => false)");
        assert!(decide("rate_limiter.acquire('c6', 'k')").ok);
        let shadow = decide("rate_limiter.acquire('c6', 'k')");
        assert_eq!((shadow.ok, shadow.granted), (true, 0.0));
        assert_eq!(one::<bool>("SELECT lease_id IS NULL FROM rate_limiter.acquire('c6', 'k', lease => '1 minute')"), Some(true));
        slots("c7", 1);
        run("SELECT rate_limiter.allow('c7', 'vip')");
        assert!(decide("rate_limiter.acquire('c7', 'vip')").ok);
        assert!(decide("rate_limiter.acquire('c7', 'vip')").ok, "an allowed key holds no slot");
        run("SELECT rate_limiter.block('c7', 'bad')");
        assert_eq!(one::<String>("SELECT reason FROM rate_limiter.acquire('c7', 'bad')").as_deref(), Some("blocked"));
    }

    #[pg_test]
    fn what_has_no_meaning_for_a_concurrency_limit_is_refused() {
        slots("c8", 2);
        let define = |extra: &str| format!("SELECT rate_limiter.define('x', 'concurrency', 2, '1 second', {extra})");
        fails(&define("shards => 2"), "0A000", "shards > 1");
        fails(&define("mode => 'partial'"), "0A000", "mode");
        fails(&define("min_gap => '1 second'"), "0A000", "minGap");
        fails(&define("lock_timeout => '1 second'"), "0A000", "lockTimeout");
        fails(&define("deny_cache => '1 second'"), "0A000", "denyCache");
        fails(&define("hot => true"), "0A000", "hot");
        fails(&define("capacity => 3"), "22023", "capacity");
        fails(&define("start => now()"), "22023", "start");
        fails("SELECT rate_limiter.define('x', 'concurrency', 1.5, '1 second')", "22023", "whole number");
        fails("SELECT rate_limiter.define('x', 'concurrency', 1001, '1 second')", "22023", "whole number");
        fails("SELECT rate_limiter.define('x', 'concurrency', 2, '1 month')", "22023", "month");
        fails("SELECT * FROM rate_limiter.rate_limit('c8', 'k', reserve => true)", "0A000", "no reservations");
        fails("SELECT * FROM rate_limiter.rate_limit('c8', 'k', 1.5)", "22023", "whole slots");
        fails("SELECT * FROM rate_limiter.rate_limit('c8', 'k', 3)", "22023", "");
        fails("SELECT * FROM rate_limiter.credit('c8', 'k')", "0A000", "release()");
        fails(r#"SELECT * FROM rate_limiter.rate_limit_all('[{"name":"c8"}]')"#, "0A000", "concurrency limit");
        fails("SELECT * FROM rate_limiter.acquire('c8', 'k', lease => '0 seconds')", "22023", "lease");
        run("SELECT rate_limiter.define('tb', 'token bucket', 1, '1 second')");
        fails("SELECT * FROM rate_limiter.acquire('tb', 'k')", "0A000", "not a concurrency limit");
    }
}
