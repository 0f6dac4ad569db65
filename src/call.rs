//! What one call is, shared by every layer: the request, the decision it gets, why a call
//! is denied (with each reason's SQL text, in one place), and the bounds on names, keys and
//! requests. Pure data: no pgrx.

/// Bytes of a limit's name.
pub const MAX_NAME_BYTES: usize = 128;
/// Bytes of a key.
pub const MAX_KEY_BYTES: usize = 1024;
/// The most limits one `rate_limit_all` call may name: each is a row lock held to commit.
pub const MAX_REQUESTS: usize = 1000;
/// The name under which the statistics count a database's names beyond its room: no limit
/// may have it.
pub const OTHER: &str = "*other*";

/// What identifies an inline config's arithmetic (`config::fingerprint`): its state is
/// kept apart from every other config's.
pub type Fingerprint = [u8; 16];

pub struct Request<'a> {
    pub name: &'a str,
    pub key: Option<&'a str>,
    pub count: f64,
    pub reserve: bool,
    /// The fingerprint of the config passed inline; `None` for a limit named in
    /// `rate_limiter.limits`.
    pub inline: Option<Fingerprint>,
    /// The key's override exempts it from its limit now (set with the config it is decided
    /// under, `overrides::config_for`): answered as an allowed key.
    pub exempt: bool,
}

/// Why a call is denied (or, for `Allowed` and an allowing `LockTimeout`, let through
/// unmetered), as `rate_limiter.decision.reason` says it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reason {
    /// Not enough tokens.
    Exhausted,
    /// Within `min_gap` of the last granted call.
    MinGap,
    /// The (name, key) is in `rate_limiter.blocks`.
    Blocked,
    /// `wait_rate_limit` waited and its timeout came first.
    Timeout,
    /// The row stayed locked by another transaction past the limit's `lock_timeout`.
    LockTimeout,
    /// The (name, key) is in `rate_limiter.allows`: ok, unmetered.
    Allowed,
    /// Would be denied, but the limit or the session is in shadow mode: ok, taking nothing.
    Shadow,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Exhausted => "exhausted",
            Reason::MinGap => "min_gap",
            Reason::Blocked => "blocked",
            Reason::Timeout => "timeout",
            Reason::LockTimeout => "lock_timeout",
            Reason::Allowed => "allowed",
            Reason::Shadow => "shadow",
        }
    }
}

/// What `rate_limit()` returns, see `rate_limiter.decision`.
#[derive(Debug, PartialEq)]
pub struct Decision {
    pub ok: bool,
    pub retry_after: Option<f64>,
    pub remaining: f64,
    pub reset_after: f64,
    pub granted: f64,
    /// Why it was denied (`None` when ok, but `Allowed` for an allowed key and `LockTimeout`
    /// with `on_lock_timeout = 'allow'`).
    pub reason: Option<Reason>,
    /// The name of the limit that denied it.
    pub limited_by: Option<String>,
}

impl Decision {
    /// This decision as shadow mode answers it (when `shadow`): a denial other than a block
    /// is ok, with reason `shadow`, nothing granted, and what it would have said of the
    /// limit (`retry_after`, `remaining`, `limited_by`). The call took nothing it would not
    /// have taken denied: the write path decided a denial before this (the penalize mode's
    /// count stays counted).
    pub fn shadowed(self, shadow: bool) -> Decision {
        if self.ok || !shadow || self.reason == Some(Reason::Blocked) {
            return self;
        }
        Decision { ok: true, granted: 0.0, reason: Some(Reason::Shadow), ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    /// The texts `rate_limiter.decision.reason` documents, one per reason.
    #[test]
    fn reasons_read_as_documented() {
        let all = [Reason::Exhausted, Reason::MinGap, Reason::Blocked, Reason::Timeout, Reason::LockTimeout, Reason::Allowed];
        let texts: Vec<&str> = all.iter().map(|r| r.as_str()).collect();
        assert_eq!(texts, ["exhausted", "min_gap", "blocked", "timeout", "lock_timeout", "allowed"]);
    }
}
