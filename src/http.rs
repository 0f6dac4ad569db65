//! HTTP response headers for a decision, as draft-ietf-httpapi-ratelimit-headers writes them
//! in structured fields (RFC 9651): draft 11, `RateLimit-Policy: "name";q=10;qu="requests";w=60`
//! and `RateLimit: "name";r=3;t=12`, each with the partition key `pk` when asked for; draft
//! 09 on request, `RateLimit-Policy: "name";q=10;w=60`; `Retry-After: 12` when denied; and
//! draft 11's problem-details body of a denial. Pure text, no pgrx.

use serde_json::{json, Map, Value};

/// The drafts whose syntax `headers` writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Draft {
    /// draft-ietf-httpapi-ratelimit-headers-09 (0.6.0's), for clients that parse it.
    Nine,
    /// draft-ietf-httpapi-ratelimit-headers-11: integer quotas, quota units, partition keys.
    Eleven,
}

impl Draft {
    /// The draft of that number, if `headers` writes it.
    pub fn numbered(number: i32) -> Option<Draft> {
        match number {
            9 => Some(Draft::Nine),
            11 => Some(Draft::Eleven),
            _ => None,
        }
    }
}

/// One limit's policy: its quota of `rate` tokens per window of `period` ms.
pub struct Policy<'a> {
    pub name: &'a str,
    pub rate: f64,
    pub period: f64,
    /// A concurrency limit: its quota is of requests at once, over no window.
    pub concurrent: bool,
    /// The partition key, the key's bytes, when the caller asks for it (draft 11's `pk`).
    pub partition: Option<&'a [u8]>,
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

/// A structured-field byte sequence: base64 (RFC 4648, padded) between colons.
fn sf_bytes(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4 + 2);
    out.push(':');
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            let sextet = (n >> (18 - 6 * i)) & 63;
            out.push(if i <= chunk.len() { ALPHABET[sextet as usize] as char } else { '=' });
        }
    }
    out.push(':');
    out
}

/// The largest integer a structured field carries (RFC 9651: at most 15 digits); a parser
/// drops a whole field with a larger one.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// A count as a structured-field integer: floored, and at most `SF_INTEGER_MAX` (a quota so
/// large is told as less than it is, never more).
fn sf_integer(x: f64) -> u64 {
    (x.max(0.0).floor() as u64).min(SF_INTEGER_MAX)
}

/// Whole seconds from milliseconds, rounded up (a client that waits that long is not early),
/// at most `SF_INTEGER_MAX`.
pub fn seconds(ms: f64) -> u64 {
    ((ms.max(0.0) / 1000.0).ceil() as u64).min(SF_INTEGER_MAX)
}

/// A number as draft 09 writes it: an integer where it is whole.
fn decimal(x: f64) -> String {
    if x.fract() == 0.0 { format!("{}", sf_integer(x)) } else { format!("{x}") }
}

/// Draft 11's quota and window, both integers: `rate` per `period` ms, scaled by the least
/// factor up to 3600 that makes both whole (0.5 a second is 1 per 2 seconds), else the whole
/// tokens of the window rounded up to a second, never more than the limit gives; each at
/// most `SF_INTEGER_MAX`.
fn whole_quota(rate: f64, period: f64) -> (u64, u64) {
    let window = period / 1000.0;
    let whole = |x: f64| (x - x.round()).abs() <= 1e-9 * x.abs().max(1.0);
    for factor in 1..=3600u32 {
        let (q, w) = (rate * f64::from(factor), window * f64::from(factor));
        if whole(q) && whole(w) && w.round() >= 1.0 {
            return (sf_integer(q.round()), sf_integer(w.round()));
        }
    }
    let w = window.ceil().max(1.0);
    (sf_integer(rate * w / window), sf_integer(w))
}

/// One member of `RateLimit-Policy`.
fn policy_item(p: &Policy<'_>, draft: Draft) -> Result<String, String> {
    let name = sf_string(p.name).ok_or_else(|| p.name.to_owned())?;
    Ok(match draft {
        Draft::Nine => format!("{name};q={};w={}", decimal(p.rate), seconds(p.period).max(1)),
        Draft::Eleven if p.concurrent => format!("{name};q={};qu=\"concurrent-requests\"", sf_integer(p.rate)),
        Draft::Eleven => {
            let (q, w) = whole_quota(p.rate, p.period);
            format!("{name};q={q};qu=\"requests\";w={w}")
        }
    } + &partition(p, draft))
}

/// `;pk=...` when the policy carries its partition key (draft 11 only).
fn partition(p: &Policy<'_>, draft: Draft) -> String {
    match (draft, p.partition) {
        (Draft::Eleven, Some(key)) => format!(";pk={}", sf_bytes(key)),
        _ => String::new(),
    }
}

/// The headers for `answer`, taken under `policies` (several for `rate_limit_all`);
/// `RateLimit` names `current`, one of them. `Err` names a limit whose name a header cannot
/// carry.
pub fn headers(policies: &[Policy<'_>], current: &str, answer: &Answer, draft: Draft) -> Result<Value, String> {
    let items: Vec<String> = policies.iter().map(|p| policy_item(p, draft)).collect::<Result<_, _>>()?;
    let pk = policies.iter().find(|p| p.name == current).map(|p| partition(p, draft)).unwrap_or_default();
    // Until more quota: when denied, until the call would pass; else until the limit is full.
    let until = if answer.ok { answer.reset_after } else { answer.retry_after.unwrap_or(answer.reset_after) };
    let name = sf_string(current).ok_or_else(|| current.to_owned())?;
    let remaining = sf_integer(answer.remaining);
    let mut headers = Map::new();
    headers.insert("RateLimit-Policy".into(), items.join(", ").into());
    headers.insert("RateLimit".into(), format!("{name};r={remaining};t={}{pk}", seconds(until)).into());
    if let (false, Some(retry_after)) = (answer.ok, answer.retry_after) {
        headers.insert("Retry-After".into(), seconds(retry_after).to_string().into());
    }
    Ok(Value::Object(headers))
}

/// Draft 11's problem-details body (RFC 9457) of a denial by the limit `violated`, with the
/// call's reason as a member of the extension's own.
pub fn problem(violated: &str, reason: &str) -> Value {
    json!({
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Request cannot be satisfied as assigned quota has been exceeded",
        "status": 429,
        "violated-policies": [violated],
        "rate_limiter-reason": reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, rate: f64, period: f64) -> Policy<'_> {
        Policy { name, rate, period, concurrent: false, partition: None }
    }

    const OK: Answer = Answer { ok: true, retry_after: None, remaining: 6.5, reset_after: 21_000.2 };
    const DENIED: Answer = Answer { ok: false, retry_after: Some(1_500.0), remaining: -2.0, reset_after: 72_000.0 };

    #[test]
    fn draft_nine_allowed_and_denied() {
        let policy = [policy("api", 10.0, 60_000.0)];
        assert_eq!(
            headers(&policy, "api", &OK, Draft::Nine).unwrap(),
            json!({"RateLimit-Policy": "\"api\";q=10;w=60", "RateLimit": "\"api\";r=6;t=22"})
        );
        assert_eq!(
            headers(&policy, "api", &DENIED, Draft::Nine).unwrap(),
            json!({"RateLimit-Policy": "\"api\";q=10;w=60", "RateLimit": "\"api\";r=0;t=2", "Retry-After": "2"})
        );
    }

    #[test]
    fn draft_nine_several_policies_fractions_and_names() {
        let policies = [policy("per \"min\"", 0.5, 500.0), policy("a\\b", 100.0, 3_600_000.0)];
        let h = headers(&policies, "a\\b", &OK, Draft::Nine).unwrap();
        assert_eq!(h["RateLimit-Policy"], "\"per \\\"min\\\"\";q=0.5;w=1, \"a\\\\b\";q=100;w=3600");
        assert_eq!(headers(&policies[..1], "é", &OK, Draft::Nine), Err("é".to_owned()));
    }

    #[test]
    fn draft_eleven_quotas_are_integers_of_requests_or_concurrent_requests() {
        let h = headers(&[policy("api", 10.0, 60_000.0)], "api", &DENIED, Draft::Eleven).unwrap();
        assert_eq!(h["RateLimit-Policy"], "\"api\";q=10;qu=\"requests\";w=60");
        assert_eq!(h["RateLimit"], "\"api\";r=0;t=2");
        assert_eq!(h["Retry-After"], "2");
        let slots = Policy { concurrent: true, ..policy("jobs", 3.0, 1_000.0) };
        assert_eq!(policy_item(&slots, Draft::Eleven).unwrap(), "\"jobs\";q=3;qu=\"concurrent-requests\"");
        // Scaled until both are whole; else the window's whole tokens, rounded down.
        assert_eq!(whole_quota(0.5, 1_000.0), (1, 2));
        assert_eq!(whole_quota(0.5, 500.0), (1, 1));
        assert_eq!(whole_quota(2.5, 60_000.0), (5, 120));
        assert_eq!(whole_quota(10.0, 1_500.0), (20, 3));
        assert_eq!(whole_quota(1.0, 86_400_000.0), (1, 86_400));
        assert_eq!(whole_quota(std::f64::consts::PI, 1_000.0), (3, 1));
        assert_eq!(whole_quota(5.0, 250.0), (20, 1), "5 a quarter second: 20 a second");
    }

    #[test]
    fn integers_have_at_most_fifteen_digits() {
        // Issue 64, F7: q=1000000000000000 made a strict parser drop the whole field.
        let huge = Answer { ok: true, retry_after: None, remaining: 1e15, reset_after: 1e20 };
        let h = headers(&[policy("api", 1e15, 1_000.0)], "api", &huge, Draft::Eleven).unwrap();
        assert_eq!(h["RateLimit-Policy"], "\"api\";q=999999999999999;qu=\"requests\";w=1");
        assert_eq!(h["RateLimit"], "\"api\";r=999999999999999;t=999999999999999");
        assert_eq!(whole_quota(1e300, 1e300), (SF_INTEGER_MAX, SF_INTEGER_MAX));
        let h = headers(&[policy("api", 1e15, 1_000.0)], "api", &huge, Draft::Nine).unwrap();
        assert_eq!(h["RateLimit-Policy"], "\"api\";q=999999999999999;w=1");
    }

    #[test]
    fn draft_eleven_partition_keys_are_byte_sequences() {
        for (bytes, text) in [("", "::"), ("f", ":Zg==:"), ("fo", ":Zm8=:"), ("foo", ":Zm9v:"), ("foobar", ":Zm9vYmFy:")] {
            assert_eq!(sf_bytes(bytes.as_bytes()), text);
        }
        let keyed = Policy { partition: Some("user 7".as_bytes()), ..policy("api", 10.0, 60_000.0) };
        let h = headers(&[keyed], "api", &OK, Draft::Eleven).unwrap();
        assert_eq!(h["RateLimit-Policy"], "\"api\";q=10;qu=\"requests\";w=60;pk=:dXNlciA3:");
        assert_eq!(h["RateLimit"], "\"api\";r=6;t=22;pk=:dXNlciA3:");
        let keyed = Policy { partition: Some(b"k"), ..policy("api", 10.0, 60_000.0) };
        assert_eq!(headers(&[keyed], "api", &OK, Draft::Nine).unwrap()["RateLimit"], "\"api\";r=6;t=22", "draft 09 has no pk");
    }
}
