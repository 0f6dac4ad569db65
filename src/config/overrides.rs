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
}
