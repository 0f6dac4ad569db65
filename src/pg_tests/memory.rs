//! Memory limits (`durable => false`) through SQL: counted with no row and no writable
//! transaction, given back with a rolled-back subtransaction, and what they cannot
//! do refused. Names are the tests' own: the counts outlive the transactions the tests run in.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{at, decide, fails, one, run};
    use pgrx::prelude::*;

    const MEMORY: &str = r#"'{"kind": "fixed window", "rate": 3, "period": "1 hour", "durable": false}'"#;

    #[pg_test]
    fn a_memory_limit_counts_without_a_row_or_a_writable_transaction() {
        run("SET transaction_read_only = on");
        let call = || decide(&format!("rate_limiter.rate_limit('mem_ro', 'k', config => {MEMORY})"));
        let answers: Vec<bool> = (0..4).map(|_| call().ok).collect();
        assert_eq!(answers, [true, true, true, false], "three of three, in a READ ONLY transaction");
        let check = decide(&format!("rate_limiter.check_rate_limit('mem_ro', 'k', 0, config => {MEMORY})"));
        assert_eq!(check.remaining, 0.0, "the check sees the calls in flight");
        assert_eq!(one::<i64>("SELECT count(*) FROM rate_limiter.state WHERE name LIKE 'mem_ro%'"), Some(0));
        let value = one::<f64>(&format!("SELECT value FROM rate_limiter.rate_limit_value('mem_ro', 'k', {MEMORY})"));
        assert_eq!(value, Some(0.0));
        let effective = one::<pgrx::JsonB>(&format!("SELECT effective_config FROM rate_limiter.rate_limit_value('mem_ro', 'k', {MEMORY})"));
        assert_eq!(effective.unwrap().0["durable"], serde_json::Value::Bool(false));
        // A durable limit still needs a writable transaction.
        fails("SELECT * FROM rate_limiter.rate_limit('mem_ro_durable', 'k', config => '{\"kind\": \"token bucket\", \"rate\": 1, \"period\": 1000}')", "25006", "");
    }

    #[pg_test]
    fn a_rolled_back_subtransaction_gives_its_tokens_back() {
        let call = || decide(&format!("rate_limiter.rate_limit('mem_sub', 'k', 2, config => {MEMORY})"));
        assert!(call().ok);
        // The DO block's exception handler rolls back its subtransaction, and the call in it.
        run(&format!(
            "DO $$ BEGIN PERFORM rate_limiter.rate_limit('mem_sub', 'k', 1, config => {MEMORY}); RAISE division_by_zero; \
             EXCEPTION WHEN division_by_zero THEN NULL; END $$"
        ));
        assert!(!call().ok, "2 of 3 taken, the rolled-back 1 given back: 2 more is 4");
        assert!(decide(&format!("rate_limiter.rate_limit('mem_sub', 'k', 1, config => {MEMORY})")).ok);
    }

    #[pg_test]
    fn what_a_memory_limit_cannot_do_is_refused() {
        // A fake clock: a refill between calls (3 a second) would change the answers under a
        // slow server (Valgrind's).
        at("0");
        let config = |extra: &str| format!(r#"'{{"kind": "token bucket", "rate": 3, "period": 1000, "durable": false{extra}}}'"#);
        for (extra, sqlstate, msg) in [
            (r#", "shards": 2"#, "0A000", "shards > 1"),
            (r#", "minGap": 10"#, "0A000", "minGap"),
            (r#", "mode": "partial""#, "0A000", "mode 'partial'"),
            (r#", "lockTimeout": 10"#, "0A000", "lockTimeout"),
        ] {
            fails(&format!("SELECT * FROM rate_limiter.rate_limit('mem_no', 'k', config => {})", config(extra)), sqlstate, msg);
        }
        fails(
            r#"SELECT * FROM rate_limiter.rate_limit('mem_no', 'k', config => '{"kind": "rolling window", "rate": 3, "period": 1000, "durable": false}')"#,
            "0A000",
            "rolling window",
        );
        fails("SELECT rate_limiter.define('mem_hot', 'token bucket', 3, '1 second', hot => true, durable => false)", "22023", "not both");
        // A credit in flight is counted by no call, this transaction's own included.
        assert!(decide(&format!("rate_limiter.rate_limit('mem_credit', 'k', 3, config => {})", config(""))).ok);
        let given = decide(&format!("rate_limiter.credit('mem_credit', 'k', 2, {})", config("")));
        assert_eq!((given.granted, given.remaining.floor()), (-2.0, 2.0), "the answer: given back, as if committed");
        assert!(!decide(&format!("rate_limiter.rate_limit('mem_credit', 'k', 1, config => {})", config(""))).ok);
        // rate_limit_all takes a memory part (tests/test_memory.py), a hot one still not.
        run("SELECT rate_limiter.define('hot_no', 'token bucket', 3, '1 second', hot => true)");
        fails(
            &format!("SELECT * FROM rate_limiter.rate_limit_all(jsonb_build_array(jsonb_build_object('name', 'mem_no', 'config', {}::jsonb), jsonb_build_object('name', 'hot_no')))", config("")),
            "0A000",
            "hot limit",
        );
        run("SELECT rate_limiter.define('mem_flip', 'token bucket', 3, '1 second', durable => false)");
        fails("UPDATE rate_limiter.limits SET durable = true WHERE name = 'mem_flip'", "0A000", "between durable and memory");
        fails("SELECT rate_limiter.define('mem_flip', 'token bucket', 3, '1 second')", "0A000", "between durable and memory");
    }
}
