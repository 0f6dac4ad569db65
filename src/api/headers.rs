//! The rate-limit HTTP headers of a decision (`http_headers`, `http_headers_all`): STABLE
//! (they read configs and write nothing) and PARALLEL RESTRICTED (they use the backend's
//! config cache).


use pgrx::prelude::*;
use pgrx::JsonB;

use crate::config::JsonbArg;
use crate::error::{Error, Result};
use crate::http;

use super::{parts, resolve, valid_name};


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

fn http_json(policies: &[http::Policy<'_>], current: &str, d: &DecisionRow<'_>) -> Result<JsonB> {
    let headers = http::headers(policies, current, &http_answer(d)?).map_err(|name| {
        Error::InvalidArgument(format!("the name \"{name}\" is not printable ASCII, which an HTTP header cannot carry"))
    })?;
    Ok(JsonB(headers))
}

/// The rate-limit HTTP response headers for decision `d` of limit `name` (its named config,
/// or `config` inline), as a jsonb object of header name to value.
#[pg_extern(stable, parallel_restricted)]
fn http_headers<'a>(
    name: Option<&'a str>,
    d: Option<pgrx::composite_type!('a, "rate_limiter.decision")>,
    config: default!(Option<JsonbArg>, "NULL"),
) -> JsonB {
    (|| -> Result<JsonB> {
        let name = valid_name(name)?;
        let d = d.ok_or_else(|| Error::InvalidArgument("d must not be NULL".into()))?;
        let config = resolve(name, config)?;
        http_json(&[http::Policy { name, rate: config.rate, period: config.period }], name, &d)
    })()
    .unwrap_or_else(|e| e.raise())
}

/// The same for a decision of `rate_limit_all(requests)`: one policy per limit named, and
/// `RateLimit` for the limit that denied it, or else the first.
#[pg_extern(stable, parallel_restricted)]
fn http_headers_all<'a>(requests: Option<JsonbArg>, d: Option<pgrx::composite_type!('a, "rate_limiter.decision")>) -> JsonB {
    (|| -> Result<JsonB> {
        let requests = requests.ok_or_else(|| Error::InvalidArgument("requests must not be NULL".into()))?.parse()?;
        let d = d.ok_or_else(|| Error::InvalidArgument("d must not be NULL".into()))?;
        let parts = parts(&requests, false)?;
        let mut policies: Vec<http::Policy<'_>> = Vec::new();
        for p in &parts {
            if !policies.iter().any(|q| q.name == p.req.name) {
                policies.push(http::Policy { name: p.req.name, rate: p.config.rate, period: p.config.period });
            }
        }
        let limited_by = d.get_by_name::<String>("limited_by").ok().flatten();
        let current = limited_by.as_deref().unwrap_or(policies[0].name);
        http_json(&policies, current, &d)
    })()
    .unwrap_or_else(|e| e.raise())
}
