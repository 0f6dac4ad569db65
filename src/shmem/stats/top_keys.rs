//! The most denied keys of one limit, approximately: a space-saving sketch (Metwally,
//! Agrawal, El Abbadi 2005) of `TOP_KEYS` counters. A key not counted yet takes a free
//! counter, or else replaces the smallest one and inherits its count as its error bound.
//! So `count - error <= true count <= count`, and every key denied more than
//! `total / TOP_KEYS` times is in the sketch. Fixed size and no pointers: it lives in
//! shared memory, and all zeros is an empty sketch.

/// Counters per limit.
pub const TOP_KEYS: usize = 64;
/// Bytes of a key kept for display; longer keys are told apart by their hash.
pub const KEY_BYTES: usize = 62;

/// `len` of a NULL key.
const NULL_KEY: u16 = u16::MAX;

/// The counters, column by column, so that an update touches few cache lines: a lookup
/// scans the 32-bit `fingerprints` (4 lines), and a replacement usually finds a smallest
/// counter a step or two after `cursor` instead of scanning all `counts`.
#[repr(C)]
pub struct TopKeys {
    used: u32,
    /// At most the smallest count (equal unless a counter at it has grown since).
    floor: u64,
    /// Where the search for a counter at `floor` goes on.
    cursor: u32,
    fingerprints: [u32; TOP_KEYS],
    hashes: [u64; TOP_KEYS],
    counts: [u64; TOP_KEYS],
    errors: [u64; TOP_KEYS],
    /// Bytes of `keys[i]` in use; `NULL_KEY` for a NULL key.
    lens: [u16; TOP_KEYS],
    keys: [[u8; KEY_BYTES]; TOP_KEYS],
}

/// One key of the sketch as shown: the key (cut to `KEY_BYTES` and ending in `…` when
/// longer), its count and how much of it may belong to keys it replaced.
#[derive(Debug, PartialEq)]
pub struct Heavy {
    pub key: Option<String>,
    pub count: u64,
    pub error: u64,
}

/// A key's identity; a leading tag tells a NULL key from an empty one.
fn identity(key: Option<&str>) -> u64 {
    match key {
        None => crate::hash::of([&[0u8][..]]),
        Some(k) => crate::hash::of([&[1u8][..], k.as_bytes()]),
    }
}

/// The longest prefix of `key` of at most `KEY_BYTES` bytes that ends on a char boundary.
fn shown(key: &str) -> &str {
    let mut end = key.len().min(KEY_BYTES);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

impl TopKeys {
    fn holds(&self, i: usize, key: Option<&str>) -> bool {
        match key {
            None => self.lens[i] == NULL_KEY,
            Some(k) => self.lens[i] != NULL_KEY && &self.keys[i][..self.lens[i] as usize] == shown(k).as_bytes(),
        }
    }

    fn set(&mut self, i: usize, hash: u64, key: Option<&str>, count: u64, error: u64) {
        self.fingerprints[i] = hash as u32;
        self.hashes[i] = hash;
        self.counts[i] = count;
        self.errors[i] = error;
        self.lens[i] = NULL_KEY;
        if let Some(k) = key {
            let kept = shown(k).as_bytes();
            self.keys[i][..kept.len()].copy_from_slice(kept);
            self.lens[i] = kept.len() as u16;
        }
    }

    /// A counter with the smallest count (the sketch is full).
    fn smallest(&mut self) -> usize {
        for _ in 0..2 {
            let start = self.cursor as usize;
            if let Some(step) = (0..TOP_KEYS).find(|s| self.counts[(start + s) % TOP_KEYS] == self.floor) {
                let i = (start + step) % TOP_KEYS;
                self.cursor = ((i + 1) % TOP_KEYS) as u32;
                return i;
            }
            // Every counter at the floor has grown: raise it to the smallest count.
            self.floor = *self.counts.iter().min().expect("TOP_KEYS > 0");
        }
        unreachable!("a counter holds the smallest count")
    }

    /// Count `n` more denials of `key`.
    pub fn add(&mut self, key: Option<&str>, n: u64) {
        let hash = identity(key);
        let used = self.used as usize;
        // Whether any fingerprint matches, in a loop the compiler vectorizes (a key not in
        // the sketch, the common case under attack by many keys, stops here); then which.
        let print = hash as u32;
        let candidates = self.fingerprints[..used].iter().fold(0u32, |n, f| n + u32::from(*f == print));
        let found = if candidates == 0 {
            None
        } else {
            (0..used).find(|&i| self.fingerprints[i] == print && self.hashes[i] == hash && self.holds(i, key))
        };
        if let Some(i) = found {
            self.counts[i] += n;
        } else if used < TOP_KEYS {
            self.set(used, hash, key, n, 0);
            self.used += 1;
            if self.used as usize == TOP_KEYS {
                self.floor = *self.counts.iter().min().expect("TOP_KEYS > 0");
                self.cursor = 0;
            }
        } else {
            let smallest = self.smallest();
            let floor = self.counts[smallest];
            self.set(smallest, hash, key, floor + n, floor);
        }
    }

    pub fn clear(&mut self) {
        self.used = 0;
    }

    /// The keys held, most denied first.
    pub fn heavy(&self) -> Vec<Heavy> {
        let mut heavy: Vec<Heavy> = (0..self.used as usize)
            .map(|i| Heavy {
                key: (self.lens[i] != NULL_KEY).then(|| {
                    let kept = String::from_utf8_lossy(&self.keys[i][..self.lens[i] as usize]).into_owned();
                    // A key cut short shows it; a key of exactly KEY_BYTES may be either.
                    if self.hashes[i] == identity(Some(&kept)) { kept } else { kept + "…" }
                }),
                count: self.counts[i],
                error: self.errors[i],
            })
            .collect();
        heavy.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        heavy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn empty() -> Box<TopKeys> {
        // All zeros is an empty sketch, as in fresh shared memory.
        // SAFETY: TopKeys is plain integers and bytes, valid at all zeros.
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn counts_exactly_while_there_is_room() {
        let mut top = empty();
        for i in 0..TOP_KEYS as u64 {
            top.add(Some(&format!("user-{i}")), i + 1);
        }
        top.add(None, 3);
        top.clear();
        top.add(None, 3);
        top.add(Some("a"), 2);
        top.add(None, 1);
        assert_eq!(
            top.heavy(),
            vec![Heavy { key: None, count: 4, error: 0 }, Heavy { key: Some("a".into()), count: 2, error: 0 }]
        );
    }

    #[test]
    fn bounds_hold_and_heavy_hitters_stay() {
        // A skewed stream of 200,000 denials over 5,000 keys, in a fixed pseudo-random order.
        let mut top = empty();
        let mut truth: HashMap<String, u64> = HashMap::new();
        let mut x: u64 = 42;
        let total = 200_000u64;
        for _ in 0..total {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let r = (x >> 33) % 1000;
            // Keys 0..4 take 40% of the stream, the rest spreads over 5,000 keys.
            let key = if r < 400 { format!("hot-{}", r % 5) } else { format!("cold-{}", (x >> 20) % 5000) };
            top.add(Some(&key), 1);
            *truth.entry(key).or_default() += 1;
        }
        let heavy = top.heavy();
        assert_eq!(heavy.len(), TOP_KEYS);
        for h in &heavy {
            let actual = truth[h.key.as_deref().unwrap()];
            assert!(h.count - h.error <= actual && actual <= h.count, "{h:?} but {actual}");
        }
        for (key, count) in &truth {
            if *count > total / TOP_KEYS as u64 {
                assert!(heavy.iter().any(|h| h.key.as_deref() == Some(key)), "{key} ({count}) is missing");
            }
        }
        assert!(heavy[..5].iter().all(|h| h.key.as_deref().unwrap().starts_with("hot-")));
    }

    #[test]
    fn long_keys_are_cut_and_told_apart() {
        let mut top = empty();
        let long = "é".repeat(40); // 80 bytes
        let other = format!("{long}x");
        top.add(Some(&long), 2);
        top.add(Some(&other), 1);
        top.add(Some(&"k".repeat(KEY_BYTES)), 1);
        let heavy = top.heavy();
        let shown = format!("{}…", "é".repeat(31));
        assert_eq!(heavy[0], Heavy { key: Some(shown.clone()), count: 2, error: 0 });
        let mut rest: Vec<_> = heavy[1..].iter().map(|h| (h.key.clone().unwrap(), h.count)).collect();
        rest.sort();
        assert_eq!(rest, vec![("k".repeat(KEY_BYTES), 1), (shown, 1)]);
    }
}
