//! Shared memory through SQL (the test server preloads the library): the statistics views
//! and `stats_reset`, and the deny cache. Names are the tests' own: the counters outlive
//! the transactions the tests run in.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::*;

    #[pg_test]
    fn statistics_count_calls_denials_and_keys_of_this_database() {
        at("0");
        run("SELECT rate_limiter.define('st_login', 'token bucket', 1, '1 hour')");
        run("SELECT rate_limiter.rate_limit('st_login', 'alice')");
        run("SELECT rate_limiter.rate_limit('st_login', 'alice')");
        run("SELECT rate_limiter.check_rate_limit('st_login', 'alice')");
        let row = "SELECT calls || '/' || allowed || '/' || denied || '/' || tokens_granted
                   FROM rate_limiter.stats WHERE name = 'st_login'";
        assert_eq!(one::<String>(row).as_deref(), Some("2/1/1/1"), "a check is not a call");
        assert_eq!(
            one::<String>("SELECT key || ':' || denied FROM rate_limiter.top_denied WHERE name = 'st_login'").as_deref(),
            Some("alice:1")
        );
        assert_eq!(one::<i64>("SELECT rate_limiter.stats_reset('st_login')"), Some(1));
        assert_eq!(one::<String>(row).as_deref(), Some("0/0/0/0"));
        // An allowed key's calls count as allowed, with what they were granted.
        run("SELECT rate_limiter.allow('st_login', 'monitor')");
        run("SELECT rate_limiter.rate_limit('st_login', 'monitor')");
        run("SELECT rate_limiter.rate_limit('st_login', 'monitor')");
        assert_eq!(one::<String>(row).as_deref(), Some("2/2/0/2"), "never denied, though the rate is 1");
        // Also as part of a rate_limit_all that another limit denies.
        run("SELECT rate_limiter.define('st_other', 'token bucket', 1, '1 hour')");
        run("SELECT rate_limiter.rate_limit('st_other', 'x')");
        let all = r#"'[{"name":"st_login","key":"monitor"},{"name":"st_other","key":"x"}]'"#;
        assert_eq!(one::<bool>(&format!("SELECT ok FROM rate_limiter.rate_limit_all({all})")), Some(false));
        assert_eq!(one::<String>(row).as_deref(), Some("3/3/0/3"));
        fails("SELECT rate_limiter.define('*other*', 'token bucket', 1, '1 hour')", "22023", "is reserved");
    }

    #[pg_test]
    fn a_denial_is_answered_from_the_deny_cache_until_a_change_to_the_limits() {
        at("0");
        // The #[pg_test]s run at once in one database, and another test's define() empties
        // this database's cache as this one's does: a few tries, each on a limit of its own.
        let answered_from_the_cache = (0..5).find(|attempt| {
            let name = format!("dc_login_{attempt}");
            run(&format!("SELECT rate_limiter.define('{name}', 'token bucket', 1, '1 hour', deny_cache => '1 minute')"));
            assert!(decide(&format!("rate_limiter.rate_limit('{name}', 'k')")).ok);
            assert!(!decide(&format!("rate_limiter.rate_limit('{name}', 'k')")).ok);
            // Tokens come back behind the limiter's back: the cached denial still answers ...
            run(&format!("UPDATE rate_limiter.state SET value = 1 WHERE name = '{name}'"));
            let cached = decide(&format!("rate_limiter.rate_limit('{name}', 'k')"));
            if cached.ok {
                return false; // another test emptied the cache meanwhile: the call took the token
            }
            assert!(cached.retry_after.is_some(), "{cached:?}");
            // ... a check reads the state.
            assert!(decide(&format!("rate_limiter.check_rate_limit('{name}', 'k')")).ok);
            true
        });
        let attempt = answered_from_the_cache.expect("no try was answered from the deny cache");
        // A change to the limits empties this database's cache at once.
        run("SELECT rate_limiter.define('dc_other', 'token bucket', 1, '1 hour')");
        assert!(decide(&format!("rate_limiter.rate_limit('dc_login_{attempt}', 'k')")).ok);
    }

    /// Issue 31: a denial cached under one inline config answers no other config's call, as
    /// the state it stands for is that config's alone (0.4.0 shared both).
    #[pg_test]
    fn a_denial_cached_under_one_inline_config_answers_no_other() {
        at("0");
        let strict = r#"'{"kind": "token bucket", "rate": 1, "period": "1 hour", "denyCache": "1 minute"}'"#;
        let app = r#"'{"kind": "token bucket", "rate": 100, "period": "1 hour", "denyCache": "1 minute"}'"#;
        assert!(decide(&format!("rate_limiter.rate_limit('dc_inline', 'k', config => {strict})")).ok);
        assert!(!decide(&format!("rate_limiter.rate_limit('dc_inline', 'k', config => {strict})")).ok);
        let d = decide(&format!("rate_limiter.rate_limit('dc_inline', 'k', config => {app})"));
        assert!(d.ok && d.remaining == 99.0, "{d:?}");
    }
}
