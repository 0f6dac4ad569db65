//! The snapshot's rows: a round's records packed by the dozen into one `bytea` (issue 53: a
//! changed key costs at most 64 bytes of WAL a round), and the log of rows replayed in the
//! order they were written. A row's keys share a dictionary of (limit, variant, config);
//! numbers that are whole, and instants that are whole microseconds near the row's own
//! instant, are written as varints; anything else as its 8 bytes, so that every record
//! reads back bit for bit.

use std::collections::HashSet;

use crate::storage::snapshot::Rows;

use super::record::{self, number, word, Record, AT, CONFIG, COUNT, LEN, LIMIT, NAME, TS, VALUE};

/// The format of a packed row: its first byte.
const FORMAT: u8 = 1;

/// A row's records stop growing past this many bytes: below PostgreSQL's 2 kB threshold,
/// so that a row is never compressed or moved out of line (work and WAL of its own).
pub const ROW_BYTES: usize = 1_800;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Bytes read in order; None past their end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let slice = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(slice)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn word(&mut self) -> Option<u64> {
        self.take(8).map(|b| word(b, 0))
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// A whole number as a varint, if it reads back bit for bit (not -0.0, not past 2^53).
fn as_whole(v: f64) -> Option<i64> {
    let i = v as i64;
    (v.abs() < 9e15 && (i as f64).to_bits() == v.to_bits()).then_some(i)
}

/// An instant (ms) as whole microseconds from `base_us`, if it reads back bit for bit.
fn as_micros(t: f64, base_us: i64) -> Option<i64> {
    let us = (t * 1000.0).round();
    if us.is_nan() || us.abs() >= 9e15 {
        return None;
    }
    let us = us as i64;
    ((us as f64 / 1000.0).to_bits() == t.to_bits()).then(|| us.wrapping_sub(base_us))
}

/// Flags of a record: the length of its counts (2 bits), then which numbers are varints.
const WHOLE_VALUE: u8 = 1 << 2;
const WHOLE_COUNT: [u8; 2] = [1 << 3, 1 << 4];
const MICROS_TS: u8 = 1 << 5;
const MICROS_AT: u8 = 1 << 6;
const MICROS_EXPIRES: u8 = 1 << 7;

/// A packed row: its bytes, how many records, and the latest of their `expires`.
pub struct Row {
    pub bytes: Vec<u8>,
    pub keys: usize,
    pub expires: f64,
}

/// `records` packed into rows of at most about `ROW_BYTES`, each relative to `now_ms`.
pub fn pack<'a>(records: impl IntoIterator<Item = &'a Record>, now_ms: f64) -> Vec<Row> {
    let base_us = (now_ms * 1000.0) as i64;
    let mut records = records.into_iter().peekable();
    let mut rows = Vec::new();
    while records.peek().is_some() {
        let mut dictionary: Vec<[u64; 3]> = Vec::new();
        let mut body = Vec::with_capacity(ROW_BYTES + 128);
        let mut expires = f64::NEG_INFINITY;
        let mut keys = 0;
        while body.len() + dictionary.len() * 24 < ROW_BYTES {
            let Some(r) = records.next() else { break };
            let names = [word(&r.counts, LIMIT), word(&r.name, 16), word(&r.counts, CONFIG)];
            let index = dictionary.iter().position(|d| *d == names).unwrap_or_else(|| {
                dictionary.push(names);
                dictionary.len() - 1
            });
            put_record(&mut body, r, index, base_us);
            expires = expires.max(r.expires);
            keys += 1;
        }
        let mut bytes = Vec::with_capacity(body.len() + 16 + dictionary.len() * 24);
        bytes.push(FORMAT);
        put_varint(&mut bytes, zigzag(base_us));
        put_varint(&mut bytes, dictionary.len() as u64);
        for names in &dictionary {
            for w in names {
                bytes.extend_from_slice(&w.to_le_bytes());
            }
        }
        bytes.extend_from_slice(&body);
        rows.push(Row { bytes, keys, expires });
    }
    rows
}

fn put_record(out: &mut Vec<u8>, r: &Record, index: usize, base_us: i64) {
    let c = &r.counts;
    let len = usize::from(c[LEN]).min(2);
    let value = as_whole(number(c, VALUE));
    let counts = COUNT.map(|at| as_whole(number(c, at)));
    let [ts, at, expires] = [number(c, TS), number(c, AT), r.expires].map(|t| as_micros(t, base_us));
    let mut flags = len as u8;
    for (set, bit) in [
        (value.is_some(), WHOLE_VALUE),
        (counts[0].is_some(), WHOLE_COUNT[0]),
        (counts[1].is_some(), WHOLE_COUNT[1]),
        (ts.is_some(), MICROS_TS),
        (at.is_some(), MICROS_AT),
        (expires.is_some(), MICROS_EXPIRES),
    ] {
        if set {
            flags |= bit;
        }
    }
    out.extend_from_slice(&r.name[..16]);
    put_varint(out, index as u64);
    out.push(flags);
    let mut put = |compact: Option<i64>, raw: f64| match compact {
        Some(v) => put_varint(out, zigzag(v)),
        None => out.extend_from_slice(&raw.to_bits().to_le_bytes()),
    };
    put(value, number(c, VALUE));
    put(ts, number(c, TS));
    for (i, count) in counts.iter().enumerate().take(len) {
        put(*count, number(c, COUNT[i]));
    }
    put(at, number(c, AT));
    put(expires, r.expires);
}

/// The records of a packed row; None if it is not of this format (a row of another version
/// is read as no records).
pub fn unpack(bytes: &[u8]) -> Option<Vec<Record>> {
    let mut r = Reader { bytes, at: 0 };
    if r.byte()? != FORMAT {
        return None;
    }
    let base_us = unzigzag(r.varint()?);
    let entries = usize::try_from(r.varint()?).ok().filter(|n| *n <= bytes.len() / 24)?;
    let mut dictionary = Vec::with_capacity(entries);
    for _ in 0..entries {
        dictionary.push([r.word()?, r.word()?, r.word()?]);
    }
    let mut records = Vec::new();
    while !r.done() {
        let key: [u8; 16] = r.take(16)?.try_into().ok()?;
        let [limit, variant, config] = *dictionary.get(usize::try_from(r.varint()?).ok()?)?;
        let flags = r.byte()?;
        let len = usize::from(flags & 3).min(2);
        let whole = |bit: u8, r: &mut Reader| -> Option<f64> {
            Some(if flags & bit != 0 { unzigzag(r.varint()?) as f64 } else { f64::from_bits(r.word()?) })
        };
        let value = whole(WHOLE_VALUE, &mut r)?;
        let instant = |bit: u8, r: &mut Reader| -> Option<f64> {
            Some(if flags & bit != 0 {
                base_us.wrapping_add(unzigzag(r.varint()?)) as f64 / 1000.0
            } else {
                f64::from_bits(r.word()?)
            })
        };
        let ts = instant(MICROS_TS, &mut r)?;
        let mut counts = [0.0; 2];
        for (i, count) in counts.iter_mut().enumerate().take(len) {
            *count = whole(WHOLE_COUNT[i], &mut r)?;
        }
        let at = instant(MICROS_AT, &mut r)?;
        let expires = instant(MICROS_EXPIRES, &mut r)?;
        records.push(Record {
            name: record::name(key, variant),
            counts: record::counts(limit, config, [value, ts, counts[0], counts[1]], len, at),
            expires,
        });
    }
    Some(records)
}

/// One row of the log, in the order written.
pub enum Logged<'a> {
    /// Records (of a round, or of a full copy).
    Records(&'a [u8]),
    /// What came before of a key, a limit or everything goes: a reset, a dropped limit, a
    /// `TRUNCATE` of the limits.
    Forget(Rows),
}

/// The records the log leaves, as if its rows were applied in order: a later record of an
/// entry replaces an earlier one, and a forget drops what came before it. Read from the
/// newest row back, so that each row costs its own length whatever the forgets; with how
/// many rows were of no format this library reads.
pub fn replay(log: &[Logged<'_>]) -> (Vec<Record>, usize) {
    let mut taken: HashSet<[u8; NAME]> = HashSet::new();
    let mut forgotten_keys: HashSet<[u8; 16]> = HashSet::new();
    let mut forgotten_limits: HashSet<u64> = HashSet::new();
    let (mut records, mut unreadable) = (Vec::new(), 0);
    for row in log.iter().rev() {
        match row {
            Logged::Forget(Rows::All) => break,
            Logged::Forget(Rows::Key(key)) => {
                forgotten_keys.insert(*key);
            }
            Logged::Forget(Rows::Limit(limit)) => {
                forgotten_limits.insert(*limit);
            }
            Logged::Records(bytes) => {
                let Some(row) = unpack(bytes) else {
                    unreadable += 1;
                    continue;
                };
                // The later of two records of an entry in one row is the newer.
                for record in row.into_iter().rev() {
                    let key: [u8; 16] = record.name[..16].try_into().expect("16 bytes");
                    if !forgotten_keys.contains(&key)
                        && !forgotten_limits.contains(&word(&record.counts, LIMIT))
                        && taken.insert(record.name)
                    {
                        records.push(record);
                    }
                }
            }
        }
    }
    (records, unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: u8, variant: u64, limit: u64, numbers: [f64; 4], len: u8, at: f64, expires: f64) -> Record {
        Record { name: record::name([key; 16], variant), counts: record::counts(limit, 7, numbers, usize::from(len), at), expires }
    }

    fn same(a: &Record, b: &Record) -> bool {
        a.name == b.name && a.counts == b.counts && a.expires.to_bits() == b.expires.to_bits()
    }

    const NOW: f64 = 1_795_000_000_123.456;

    #[test]
    fn every_record_reads_back_bit_for_bit() {
        let odd = [
            [9.0, NOW, 0.0, 0.0],
            [8.999999999999, NOW - 0.000_1, 3.0, -0.0],
            [-2.5, NOW + 3_600_000.0, 1e300, f64::MIN_POSITIVE],
            [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 2f64.powi(60)],
            [0.1 + 0.2, NOW / 3.0, -7.0, 1.0 / 3.0],
        ];
        let records: Vec<Record> = (0..300)
            .map(|i| {
                let n = odd[i % odd.len()];
                record(i as u8, (i % 3) as u64, 1 + (i % 2) as u64, n, (i % 3) as u8, n[1] - 17.0, NOW + i as f64 * 1000.5)
            })
            .collect();
        let rows = pack(&records, NOW);
        assert!(rows.len() > 1, "300 records take more than one row");
        assert!(rows.iter().all(|r| r.bytes.len() < 2_032), "no row reaches the TOAST threshold");
        let back: Vec<Record> = rows.iter().flat_map(|r| unpack(&r.bytes).unwrap()).collect();
        assert_eq!(back.len(), records.len());
        for (a, b) in records.iter().zip(&back) {
            // Counts past their length are not kept: they read back as 0.
            let len = usize::from(a.counts[LEN]);
            let mut expected = a.counts;
            for at in &COUNT[len..] {
                expected[*at..*at + 8].copy_from_slice(&0f64.to_bits().to_le_bytes());
            }
            assert!(same(&Record { counts: expected, ..*a }, b), "record {:?}", a.name[0]);
        }
        assert_eq!(rows.iter().map(|r| r.keys).sum::<usize>(), 300);
        assert_eq!(rows.last().unwrap().expires, NOW + 299.0 * 1000.5);
    }

    #[test]
    fn a_key_counted_now_packs_in_at_most_48_bytes() {
        // A fixed window's key as a round finds it: a whole count, instants at whole
        // microseconds within the hour.
        let now = (NOW * 1000.0).round() / 1000.0;
        let records: Vec<Record> =
            (0..1_000).map(|i| record(i as u8, 0, 1, [999.0, now - 1.5, 1.0, 0.0], 1, now - 0.25, now + 3_599_000.0)).collect();
        let rows = pack(&records, now);
        let bytes: usize = rows.iter().map(|r| r.bytes.len()).sum();
        assert!(bytes <= 1_000 * 48, "{bytes} bytes for 1,000 keys");
    }

    #[test]
    fn a_damaged_row_reads_as_nothing() {
        let rows = pack(&[record(1, 0, 1, [1.0, NOW, 0.0, 0.0], 0, NOW, NOW)], NOW);
        let bytes = &rows[0].bytes;
        for cut in 0..bytes.len() {
            let _ = unpack(&bytes[..cut]);
        }
        assert!(unpack(&[2, 0, 0]).is_none(), "another format");
        assert!(unpack(&[FORMAT, 0, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_none(), "a dictionary longer than the row");
    }

    #[test]
    fn the_log_replays_in_order_with_its_forgets() {
        let r = |key, variant, limit, value: f64| record(key, variant, limit, [value, NOW, 0.0, 0.0], 0, NOW, NOW);
        let first = pack(&[r(1, 0, 1, 5.0), r(1, 9, 1, 4.0), r(2, 0, 1, 3.0), r(3, 0, 2, 2.0)], NOW);
        let second = pack(&[r(2, 0, 1, 1.0), r(4, 0, 2, 6.0)], NOW);
        let third = pack(&[r(1, 0, 1, 0.0)], NOW);
        let key = |k: u8| [k; 16];
        let log = [
            Logged::Records(&first[0].bytes),
            Logged::Records(&second[0].bytes),
            Logged::Forget(Rows::Key(key(1))),
            Logged::Forget(Rows::Limit(2)),
            Logged::Records(&third[0].bytes),
            Logged::Records(&[9, 9]),
        ];
        let (left, unreadable) = replay(&log);
        assert_eq!(unreadable, 1);
        let mut left: Vec<(u8, u64, f64)> = left.iter().map(|r| (r.name[0], word(&r.name, 16), number(&r.counts, VALUE))).collect();
        left.sort_by(|a, b| a.partial_cmp(b).unwrap());
        // Key 1's both configs went with the reset, then its named limit came back; key 2 is
        // at its later record; limit 2's keys went with it.
        assert_eq!(left, vec![(1, 0, 0.0), (2, 0, 1.0)]);
        assert!(replay(&[Logged::Records(&first[0].bytes), Logged::Forget(Rows::All)]).0.is_empty());
        // Two records of one entry in a row: the later stands.
        let twice = pack(&[r(5, 0, 1, 1.0), r(5, 0, 1, 2.0)], NOW);
        let (left, _) = replay(&[Logged::Records(&twice[0].bytes)]);
        assert_eq!(left.iter().map(|r| number(&r.counts, VALUE)).collect::<Vec<_>>(), vec![2.0]);
    }
}
