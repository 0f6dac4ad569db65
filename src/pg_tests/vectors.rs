//! The contract's vectors (contract/vectors.json, docs/testing.md): each case's calls answered
//! by the bucket arithmetic alone, one state per key and no table, must be the file's
//! answers; and through SQL (contract/replay.sql, which the SQL-only edition replays too, on
//! a stock server) the extension must give them as well.

#[pgrx::pg_schema]
mod tests {
    use std::collections::HashMap;

    use pgrx::prelude::*;
    use serde_json::{json, Value};

    use crate::api::{request, usable};
    use crate::bucket::{self, State};
    use crate::config;
    use crate::error::Error;

    const VECTORS: &str = include_str!("../../contract/vectors.json");
    const REPLAY: &str = include_str!("../../contract/replay.sql");
    /// Where the bucket's answers are written when they differ from the file's.
    const WRITTEN: &str = "/tmp/rate_limiter_vectors.json";

    fn error(e: &Error) -> Value {
        json!({"sqlstate": e.code(), "message": e.to_string()})
    }

    /// A number as `to_jsonb` writes a float8: the infinities as strings.
    fn number(v: f64) -> Value {
        match v {
            f64::INFINITY => json!("Infinity"),
            f64::NEG_INFINITY => json!("-Infinity"),
            _ => json!(v),
        }
    }

    /// The answer of one step of `case`, `states` the keys' states so far.
    fn answer(case: &Value, step: &Value, start: f64, states: &mut HashMap<Option<String>, State>) -> Value {
        let name = case["name"].as_str();
        let key = match step.get("key") {
            Some(k) => k.as_str(),
            None => case["key"].as_str(),
        };
        let call = step["call"].as_str().unwrap_or("rate_limit");
        let count = step["count"].as_f64().unwrap_or(1.0);
        let reserve = step["reserve"].as_bool().unwrap_or(false);
        let now = start + step["at"].as_f64().expect("each step has its instant");
        // In the order the SQL entries check them.
        let req = match request(name, key, Some(count), (call != "credit").then_some(reserve)) {
            Ok(req) => req,
            Err(e) => return error(&e),
        };
        let config = match config::from_json(&case["config"]) {
            Ok(c) => c,
            Err(e) => return error(&e),
        };
        if call != "credit" {
            if let Err(e) = usable(&req, &config) {
                return error(&e);
            }
        }
        // A key's state is what a call last wrote; one never written starts fresh at each
        // call, as a missing row does.
        let k = key.map(str::to_owned);
        let state = states.get(&k).cloned().unwrap_or_else(|| bucket::fresh(&config, req.name, key, now));
        let outcome = match call {
            "credit" => bucket::plan_credit(&[state], &config, now, count),
            "rate_limit" | "check_rate_limit" => bucket::plan(&[state], &config, now, count, reserve),
            other => panic!("a vector's call is rate_limit, check_rate_limit or credit, not {other}"),
        };
        let (after, changed) = outcome.after[0].clone();
        if call != "check_rate_limit" && changed {
            states.insert(k, after);
        }
        let d = outcome.decision(req.name).shadowed(!config.enforce);
        json!({
            "ok": d.ok,
            "retry_after": d.retry_after.map(number),
            "remaining": number(d.remaining),
            "reset_after": number(d.reset_after),
            "granted": number(d.granted),
            "reason": d.reason.map(|r| r.as_str()),
            "limited_by": d.limited_by,
        })
    }

    /// The file as the bucket answers it: its inputs as they are, one step a line, each with
    /// the answer the arithmetic gives.
    fn answered(vectors: &Value) -> String {
        let start = vectors["start"].as_f64().expect("the vectors' start, in ms since the epoch");
        let mut out = String::new();
        out += &format!("{{\"about\": {},\n \"start\": {},\n \"cases\": [\n", vectors["about"], vectors["start"]);
        let cases = vectors["cases"].as_array().expect("a list of cases");
        for (i, case) in cases.iter().enumerate() {
            let mut states = HashMap::new();
            out += &format!(
                "  {{\"about\": {}, \"name\": {}, \"key\": {}, \"config\": {},\n   \"steps\": [\n",
                case["about"], case["name"], case["key"], case["config"]
            );
            let steps = case["steps"].as_array().expect("a list of steps");
            for (j, step) in steps.iter().enumerate() {
                let mut line = serde_json::Map::new();
                for field in ["at", "key", "call", "count", "reserve"] {
                    if let Some(v) = step.get(field) {
                        line.insert(field.into(), v.clone());
                    }
                }
                let expect = answer(case, step, start, &mut states);
                let inputs = Value::Object(line).to_string();
                let comma = if j + 1 < steps.len() { "," } else { "" };
                out += &format!("    {}, \"expect\": {}}}{comma}\n", &inputs[..inputs.len() - 1], ordered(&expect));
            }
            out += if i + 1 < cases.len() { "  ]},\n" } else { "  ]}\n" };
        }
        out + " ]}\n"
    }

    /// A decision's fields in the order of `rate_limiter.decision`, an error's as it is.
    fn ordered(expect: &Value) -> String {
        if expect.get("sqlstate").is_some() {
            return format!("{{\"sqlstate\": {}, \"message\": {}}}", expect["sqlstate"], expect["message"]);
        }
        let fields = ["ok", "retry_after", "remaining", "reset_after", "granted", "reason", "limited_by"];
        let parts: Vec<String> = fields.iter().map(|f| format!("\"{f}\": {}", expect[*f])).collect();
        format!("{{{}}}", parts.join(", "))
    }

    #[pg_test]
    fn the_bucket_and_the_extension_give_the_vectors_answers() {
        let vectors: Value = serde_json::from_str(VECTORS).expect("contract/vectors.json is JSON");
        let answered = answered(&vectors);
        if answered != VECTORS {
            std::fs::write(WRITTEN, &answered).expect("writable /tmp");
            panic!(
                "the bucket's answers differ from contract/vectors.json: written to {WRITTEN} \
                 (diff them, and copy it over when the change is meant)"
            );
        }
        Spi::run(REPLAY).expect("contract/replay.sql");
        let mismatches: Vec<String> = Spi::connect(|c| {
            c.select("SELECT format('%s, step %s: expected %s, answered %s', about, step, expected, answered) \
                      FROM pg_temp.vector_mismatches($1::jsonb)", None, &[VECTORS.into()])
                .unwrap()
                .map(|row| row.get::<String>(1).unwrap().unwrap())
                .collect()
        });
        assert!(mismatches.is_empty(), "through SQL:\n{}", mismatches.join("\n"));
    }
}
