//! The rate-limit HTTP headers of a decision (`http_headers`, `http_headers_all`): STABLE
//! (they read configs and overrides and write nothing) and PARALLEL RESTRICTED (they use the
//! backend's config cache); and the problem-details body of a denial (`http_problem`), from
//! the decision alone: IMMUTABLE and PARALLEL SAFE.


use pgrx::prelude::*;
use pgrx::JsonB;

use crate::bucket::{Config, Kind};
use crate::config::JsonbArg;
use crate::error::{Error, Result};
use crate::http;

use super::{parts, request, resolve_for};


/// A `rate_limiter.decision` passed in (written out in each signature: pgrx reads the SQL
/// type from the macro there).
type DecisionRow<'a> = pgrx::composite_type!('a, "rate_limiter.decision");

/// What the HTTP headers need of a decision.
fn http_answer(d: &DecisionRow<'_>) -> Result<http::Answer> {
    let field = |name: &str| d.get_by_name::<f64>(name).map_err(|e| Error::InvalidArgument(format!("decision.{name}: {e}")));
    let ok = d.get_by_name::<bool>("ok").map_err(|e| Error::InvalidArgument(format!("decision.ok: {e}")))?;
    Ok(http::Answer {
        ok: ok.ok_or_else(|| Error::InvalidArgument("decision.ok must not be NULL".into()))?,
        retry_after: field("retry_after")?,
        remaining: field("remaining")?.unwrap_or(0.0),
        reset_after: field("reset_after")?.unwrap_or(0.0),
    })
}

fn http_json(policies: &[http::Policy<'_>], current: &str, d: &DecisionRow<'_>, draft: Option<i32>) -> Result<JsonB> {
    let draft = draft.ok_or_else(|| Error::InvalidArgument("draft must not be NULL".into()))?;
    let draft = http::Draft::numbered(draft).ok_or_else(|| Error::InvalidArgument(format!("draft must be 9 or 11, not {draft}")))?;
    let headers = http::headers(policies, current, &http_answer(d)?, draft).map_err(|name| {
        Error::InvalidArgument(format!("the name \"{name}\" is not printable ASCII, which an HTTP header cannot carry"))
    })?;
    Ok(JsonB(headers))
}

/// `name`'s policy under `config`, with its key's bytes as the partition key when `partition_key`
/// (none for the NULL key, which is no one's).
fn policy<'a>(name: &'a str, key: Option<&'a str>, config: &Config, partition_key: Option<bool>) -> http::Policy<'a> {
    http::Policy {
        name,
        rate: config.rate,
        period: config.period,
        concurrent: config.kind == Kind::Concurrency,
        partition: key.filter(|_| partition_key == Some(true)).map(str::as_bytes),
    }
}

/// The rate-limit HTTP response headers for decision `d` of `key` under limit `name` (its
/// named config and the key's override, or `config` inline), as a jsonb object of header
/// name to value, in the syntax of `draft` (11 or 9). A symbol of its own since 0.7.0, which
/// added `key`, `draft` and `partition_key`: 0.6.0's SQL names the one below.
#[pg_extern(name = "http_headers", stable, parallel_restricted)]
fn http_headers_since_0_7_0<'a>(
    name: Option<&'a str>,
    d: Option<pgrx::composite_type!('a, "rate_limiter.decision")>,
    config: default!(Option<JsonbArg>, "NULL"),
    key: default!(Option<&'a str>, "NULL"),
    draft: default!(Option<i32>, "11"),
    partition_key: default!(Option<bool>, "false"),
) -> JsonB {
    (|| -> Result<JsonB> {
        let mut req = request(name, key, Some(0.0), None)?;
        let d = d.ok_or_else(|| Error::InvalidArgument("d must not be NULL".into()))?;
        let config = resolve_for(&mut req, config)?;
        http_json(&[policy(req.name, req.key, &config, partition_key)], req.name, &d, draft)
    })()
    .unwrap_or_else(|e| e.raise())
}

/// `http_headers` of 0.2.0 to 0.6.0, for a database not yet updated (which has no
/// overrides): draft 09's syntax. No SQL: their scripts declare it.
#[pg_extern(sql = false)]
fn http_headers<'a>(
    name: Option<&'a str>,
    d: Option<pgrx::composite_type!('a, "rate_limiter.decision")>,
    config: Option<JsonbArg>,
) -> JsonB {
    http_headers_since_0_7_0(name, d, config, None, Some(9), Some(false))
}

/// The same for a decision of `rate_limit_all(requests)`: one policy per limit named (its
/// first key's), and `RateLimit` for the limit that denied it, or else the first. A symbol
/// of its own since 0.7.0, as `http_headers`'.
#[pg_extern(name = "http_headers_all", stable, parallel_restricted)]
fn http_headers_all_since_0_7_0<'a>(
    requests: Option<JsonbArg>,
    d: Option<pgrx::composite_type!('a, "rate_limiter.decision")>,
    draft: default!(Option<i32>, "11"),
    partition_key: default!(Option<bool>, "false"),
) -> JsonB {
    (|| -> Result<JsonB> {
        let requests = requests.ok_or_else(|| Error::InvalidArgument("requests must not be NULL".into()))?.parse()?;
        let d = d.ok_or_else(|| Error::InvalidArgument("d must not be NULL".into()))?;
        let parts = parts(&requests, false)?;
        let mut policies: Vec<http::Policy<'_>> = Vec::new();
        for p in &parts {
            if !policies.iter().any(|q| q.name == p.req.name) {
                policies.push(policy(p.req.name, p.req.key, &p.config, partition_key));
            }
        }
        let limited_by = d.get_by_name::<String>("limited_by").ok().flatten();
        let current = limited_by.as_deref().unwrap_or(policies[0].name);
        http_json(&policies, current, &d, draft)
    })()
    .unwrap_or_else(|e| e.raise())
}

/// `http_headers_all` of 0.2.0 to 0.6.0, for a database not yet updated: draft 09's syntax.
/// No SQL: their scripts declare it.
#[pg_extern(sql = false)]
fn http_headers_all<'a>(requests: Option<JsonbArg>, d: Option<pgrx::composite_type!('a, "rate_limiter.decision")>) -> JsonB {
    http_headers_all_since_0_7_0(requests, d, Some(9), Some(false))
}

/// Draft 11's problem-details body (`application/problem+json`) for decision `d`: type
/// quota-exceeded, naming the limit that denied it; NULL when `d` let the call through.
#[pg_extern(immutable, parallel_safe)]
fn http_problem<'a>(d: Option<pgrx::composite_type!('a, "rate_limiter.decision")>) -> Option<JsonB> {
    (|| -> Result<Option<JsonB>> {
        let d = d.ok_or_else(|| Error::InvalidArgument("d must not be NULL".into()))?;
        if http_answer(&d)?.ok {
            return Ok(None);
        }
        let text = |column: &str| d.get_by_name::<String>(column).ok().flatten();
        let violated = text("limited_by").ok_or_else(|| Error::InvalidArgument("decision.limited_by of a denial must not be NULL".into()))?;
        Ok(Some(JsonB(http::problem(&violated, &text("reason").unwrap_or_default()))))
    })()
    .unwrap_or_else(|e| e.raise())
}
