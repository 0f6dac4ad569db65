//! HTTP response headers for a decision, as draft-ietf-httpapi-ratelimit-headers (draft 09)
//! writes them in structured fields: `RateLimit-Policy: "name";q=10;w=60`,
//! `RateLimit: "name";r=3;t=12`, and `Retry-After: 12` when denied. Pure text, no pgrx.

use serde_json::{Map, Value};

/// One limit's policy: its quota of `rate` tokens per window of `period` ms.
pub struct Policy<'a> {
    pub name: &'a str,
    pub rate: f64,
    pub period: f64,
}

/// The decision's numbers that the headers show (ms, tokens).
pub struct Answer {
    pub ok: bool,
    pub retry_after: Option<f64>,
    pub remaining: f64,
    pub reset_after: f64,
}

/// A structured-field string: printable ASCII only, with `"` and `\` escaped; `None` when
/// the name has other characters, which a header cannot carry as a string.
fn sf_string(name: &str) -> Option<String> {
    if !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return None;
    }
    Some(format!("\"{}\"", name.replace('\\', "\\\\").replace('"', "\\\"")))
}

/// Whole seconds from milliseconds, rounded up (a client that waits that long is not early).
fn seconds(ms: f64) -> u64 {
    (ms.max(0.0) / 1000.0).ceil() as u64
}

/// The headers for `answer`, taken under `policies` (several for `rate_limit_all`);
/// `RateLimit` names `current`. `Err` names a limit whose name a header cannot carry.
pub fn headers(policies: &[Policy<'_>], current: &str, answer: &Answer) -> Result<Value, String> {
    let quoted = |name: &str| sf_string(name).ok_or_else(|| name.to_owned());
    let mut policy_items = Vec::new();
    for p in policies {
        // Integers where the numbers are whole; a quota below one token is still one.
        let quota = if p.rate.fract() == 0.0 { format!("{}", p.rate as u64) } else { format!("{}", p.rate) };
        policy_items.push(format!("{};q={quota};w={}", quoted(p.name)?, seconds(p.period).max(1)));
    }
    // Until more quota: when denied, until the call would pass; else until the limit is full.
    let until = if answer.ok { answer.reset_after } else { answer.retry_after.unwrap_or(answer.reset_after) };
    let mut headers = Map::new();
    headers.insert("RateLimit-Policy".into(), policy_items.join(", ").into());
    headers.insert(
        "RateLimit".into(),
        format!("{};r={};t={}", quoted(current)?, answer.remaining.max(0.0).floor() as u64, seconds(until)).into(),
    );
    if let (false, Some(retry_after)) = (answer.ok, answer.retry_after) {
        headers.insert("Retry-After".into(), seconds(retry_after).to_string().into());
    }
    Ok(Value::Object(headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_and_denied() {
        let policy = [Policy { name: "api", rate: 10.0, period: 60_000.0 }];
        let ok = Answer { ok: true, retry_after: None, remaining: 6.5, reset_after: 21_000.2 };
        assert_eq!(
            headers(&policy, "api", &ok).unwrap(),
            serde_json::json!({"RateLimit-Policy": "\"api\";q=10;w=60", "RateLimit": "\"api\";r=6;t=22"})
        );
        let denied = Answer { ok: false, retry_after: Some(1_500.0), remaining: -2.0, reset_after: 72_000.0 };
        assert_eq!(
            headers(&policy, "api", &denied).unwrap(),
            serde_json::json!({"RateLimit-Policy": "\"api\";q=10;w=60", "RateLimit": "\"api\";r=0;t=2", "Retry-After": "2"})
        );
    }

    #[test]
    fn several_policies_fractions_and_names() {
        let policies = [
            Policy { name: "per \"min\"", rate: 0.5, period: 500.0 },
            Policy { name: "a\\b", rate: 100.0, period: 3_600_000.0 },
        ];
        let ok = Answer { ok: true, retry_after: None, remaining: 0.0, reset_after: 0.0 };
        let h = headers(&policies, "a\\b", &ok).unwrap();
        assert_eq!(h["RateLimit-Policy"], "\"per \\\"min\\\"\";q=0.5;w=1, \"a\\\\b\";q=100;w=3600");
        assert_eq!(h["RateLimit"], "\"a\\\\b\";r=0;t=0");
        assert_eq!(headers(&policies[..1], "é", &ok), Err("é".to_owned()));
    }
}
