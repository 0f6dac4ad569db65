//! A key's own numbers under a named limit (`rate_limiter.overrides`): the limit's row with
//! them in place of its own, parsed and validated as any row is.

use pgrx::prelude::*;

use super::parse::LimitRow;

/// The numbers of an override as stored; `None`: the limit's own.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Override {
    pub rate: Option<f64>,
    pub period: Option<Interval>,
    pub capacity: Option<f64>,
    pub max_reserved: Option<f64>,
    pub min_gap: Option<Interval>,
}

impl Override {
    /// The limit's row `row` with these numbers in place of its own. A capacity not given
    /// follows a rate that is, as `define`'s does; else it is the limit's.
    pub fn applied_to(&self, row: &LimitRow) -> LimitRow {
        LimitRow {
            rate: self.rate.unwrap_or(row.rate),
            period: self.period.unwrap_or(row.period),
            capacity: if self.capacity.is_some() || self.rate.is_some() { self.capacity } else { row.capacity },
            max_reserved: self.max_reserved.or(row.max_reserved),
            min_gap: self.min_gap.or(row.min_gap),
            ..row.clone()
        }
    }

    /// An inline config's members (`json`, an object) with these numbers in place of the
    /// call's own, as `applied_to` puts them in a limit's row: a period and a minimum gap as
    /// interval text, which a calendar period stays; the aliases of a member replaced with it.
    pub fn in_json(&self, json: &serde_json::Value) -> serde_json::Value {
        let mut object = json.as_object().cloned().unwrap_or_default();
        let mut put = |names: &[&str], value: serde_json::Value| {
            for name in names {
                object.remove(*name);
            }
            object.insert(names[0].to_owned(), value);
        };
        if let Some(rate) = self.rate {
            put(&["rate"], rate.into());
        }
        if let Some(period) = self.period {
            put(&["period"], crate::clock::interval_text(period).into());
        }
        match (self.capacity, self.rate) {
            (Some(capacity), _) => put(&["capacity"], capacity.into()),
            (None, Some(_)) => put(&["capacity"], serde_json::Value::Null), // follows the rate
            (None, None) => {}
        }
        if let Some(max_reserved) = self.max_reserved {
            put(&["maxReserved", "max_reserved"], max_reserved.into());
        }
        if let Some(min_gap) = self.min_gap {
            put(&["minGap", "min_gap"], crate::clock::interval_text(min_gap).into());
        }
        serde_json::Value::Object(object)
    }
}
