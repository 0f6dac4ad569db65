//! State in transactions: expiry and prune, named and inline rows, read-only
//! transactions, the fake clock, subtransactions, many updates in one statement, and a
//! hostile search_path.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::*;

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
                "SELECT extract(epoch FROM expires - '{T0}')::float8 FROM rate_limiter.state \
                 WHERE (name = '{name}' OR {}) AND key = '{key}'",
                inline_rows(name)
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
            one::<f64>(&format!(
                "SELECT sum(value) FROM rate_limiter.state WHERE (name = 'both' OR {}) AND shard {sign} 0",
                inline_rows("both")
            ))
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
        run("SELECT rate_limiter.allow('ro', 'allowed')");
        run("SELECT rate_limiter.block('ro', 'blocked')");
        run("SET transaction_read_only = on");
        // Refused before the lists answer, as every other key is.
        fails("SELECT rate_limiter.rate_limit('ro', 'allowed')", "25006", "read-only");
        fails("SELECT rate_limiter.rate_limit('ro', 'blocked')", "25006", "read-only");
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
}
