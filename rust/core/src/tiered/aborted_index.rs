//! The aborted-transaction index of one topic ledger (SPEC §3.4, Kafka's
//! `TransactionIndex`).
//!
//! One record per transaction whose ABORT marker lies in the ledger: the
//! transaction id, its first position, its last position (the marker) and
//! the last-stable position (the READ_COMMITTED bound) when it aborted.
//! Records are appended with strictly increasing last position.
//!
//! A READ_COMMITTED read of `[fetch_start, upper_bound)` asks each index from
//! the fetch's ledger onward for the records with `last >= fetch_start` and
//! `first < upper_bound` ([`AbortedTxnIndex::collect`]), and may stop at the
//! first record whose last-stable position is `>= upper_bound`: every
//! transaction that aborts later was still open at that point, so it started
//! at or after `upper_bound` and has nothing inside the fetch. An empty index
//! is never complete.
//!
//! ## Bytes (little endian; the same in a local file and a remote upload)
//! ```text
//! header  36 B: magic "TSTXIDX1" | version u32 (=1) | ledger_id u64
//!               | reserved u64 (0) | reserved u32 (0) | crc32c u32 of the 32 bytes before
//! record  68 B: txn most u64 | txn least u64 | first (ledger u64, entry u64)
//!               | last (ledger u64, entry u64) | last_stable (ledger u64, entry u64)
//!               | crc32c u32 of the 64 bytes before
//! ```
//! Records are appended to a local file as aborts happen, without a sync: the
//! index is derived data. It is never trusted blindly: [`AbortedTxnIndex::decode`]
//! checks every checksum and the ordering rules, and [`AbortedTxnIndex::matches`]
//! checks it against the ABORT markers actually found in the ledger before
//! it is uploaded; when either fails, [`AbortedTxnIndex::rebuild`] makes a new
//! one from the markers.

use crate::error::{Error, Result};
use crate::ledger::journal::{le_u32, le_u64};
use crate::position::Position;

/// Magic bytes that open every index.
pub const MAGIC: &[u8; 8] = b"TSTXIDX1";
/// The only format version this build reads and writes.
pub const VERSION: u32 = 1;
/// Size of the header in bytes.
pub const HEADER_LEN: usize = 36;
/// Size of one record in bytes.
pub const RECORD_LEN: usize = 68;

/// One aborted transaction of the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    /// Transaction id as `(most_bits, least_bits)`.
    pub txn: (u64, u64),
    /// Position of the transaction's first message (possibly in an earlier ledger).
    pub first: Position,
    /// Position of its ABORT marker, in this ledger.
    pub last: Position,
    /// The last-stable position (READ_COMMITTED bound) when it aborted.
    pub last_stable: Position,
}

/// What [`AbortedTxnIndex::collect`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Collected {
    /// Records overlapping the fetch, in index order.
    pub aborted: Vec<AbortedTxn>,
    /// True when no later index can hold a transaction overlapping the fetch.
    pub complete: bool,
}

/// The aborted-transaction index of one ledger, held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbortedTxnIndex {
    ledger_id: u64,
    records: Vec<AbortedTxn>,
}

fn corrupt(offset: usize, reason: impl Into<String>) -> Error {
    Error::CorruptIndex {
        kind: "aborted-txn index".into(),
        offset,
        reason: reason.into(),
    }
}

fn pos_at(b: &[u8], at: usize) -> Position {
    Position::new(le_u64(&b[at..]), le_u64(&b[at + 8..]))
}

impl AbortedTxnIndex {
    /// An empty index for `ledger_id`.
    pub fn new(ledger_id: u64) -> Self {
        Self {
            ledger_id,
            records: Vec::new(),
        }
    }

    /// The ledger this index describes.
    pub fn ledger_id(&self) -> u64 {
        self.ledger_id
    }

    /// True when no transaction aborted in this ledger.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The records, in order of increasing last position.
    pub fn records(&self) -> &[AbortedTxn] {
        &self.records
    }

    /// Checks one record against this index's rules without adding it.
    fn check_next(&self, r: &AbortedTxn) -> std::result::Result<(), String> {
        if r.last.ledger_id != self.ledger_id {
            return Err(format!(
                "last position {} is not in ledger {}",
                r.last, self.ledger_id
            ));
        }
        if r.first > r.last {
            return Err(format!(
                "first position {} is after last position {}",
                r.first, r.last
            ));
        }
        if r.last_stable > r.last {
            return Err(format!(
                "last-stable position {} is after last position {}",
                r.last_stable, r.last
            ));
        }
        if let Some(prev) = self.records.last() {
            if r.last <= prev.last {
                return Err(format!(
                    "last position {} does not follow the previous record's {}",
                    r.last, prev.last
                ));
            }
        }
        Ok(())
    }

    /// Appends a record; its last position must follow every earlier one,
    /// lie in this ledger, and not precede its first or last-stable position.
    pub fn append(&mut self, r: AbortedTxn) -> Result<()> {
        self.check_next(&r).map_err(Error::invalid)?;
        self.records.push(r);
        Ok(())
    }

    /// The records with `last >= fetch_start` and `first < upper_bound`, and
    /// whether the collection is complete (a record with
    /// `last_stable >= upper_bound` was reached).
    pub fn collect(&self, fetch_start: Position, upper_bound: Position) -> Collected {
        let mut out = Collected::default();
        // Records are sorted by `last`: skip those ending before the fetch.
        let from = self.records.partition_point(|r| r.last < fetch_start);
        for r in &self.records[from..] {
            if r.first < upper_bound {
                out.aborted.push(*r);
            }
            if r.last_stable >= upper_bound {
                out.complete = true;
                break;
            }
        }
        out
    }

    /// Checks every rule of the index (ordering, ledger, first <= last,
    /// last_stable <= last); the first broken one is a `CorruptIndex` error.
    pub fn sanity_check(&self) -> Result<()> {
        let mut check = Self::new(self.ledger_id);
        for (i, r) in self.records.iter().enumerate() {
            check
                .check_next(r)
                .map_err(|reason| corrupt(HEADER_LEN + i * RECORD_LEN, reason))?;
            check.records.push(*r);
        }
        Ok(())
    }

    /// The header bytes that open an index file of `ledger_id`.
    pub fn encode_header(ledger_id: u64) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..20].copy_from_slice(&ledger_id.to_le_bytes());
        let crc = crc32c::crc32c(&h[..32]);
        h[32..36].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// The bytes of one record, as appended to an index file.
    pub fn encode_record(r: &AbortedTxn) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        let words = [
            r.txn.0,
            r.txn.1,
            r.first.ledger_id,
            r.first.entry_id,
            r.last.ledger_id,
            r.last.entry_id,
            r.last_stable.ledger_id,
            r.last_stable.entry_id,
        ];
        for (i, w) in words.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The whole index as bytes (header and records).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.records.len() * RECORD_LEN);
        out.extend_from_slice(&Self::encode_header(self.ledger_id));
        for r in &self.records {
            out.extend_from_slice(&Self::encode_record(r));
        }
        out
    }

    /// Decodes and checks an index. Any damage (a bad magic, version or
    /// checksum, a partial record, a broken ordering rule) is a
    /// `CorruptIndex` error naming the byte offset: the caller rebuilds.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < HEADER_LEN {
            return Err(corrupt(
                0,
                format!(
                    "{} bytes is shorter than the {HEADER_LEN}-byte header",
                    bytes.len()
                ),
            ));
        }
        if &bytes[..8] != MAGIC {
            return Err(corrupt(0, "bad magic (not an aborted-txn index)"));
        }
        let stored = le_u32(&bytes[32..]);
        if crc32c::crc32c(&bytes[..32]) != stored {
            return Err(corrupt(32, "header checksum mismatch"));
        }
        let version = le_u32(&bytes[8..]);
        if version != VERSION {
            return Err(corrupt(
                8,
                format!("unknown format version {version} (this build reads {VERSION})"),
            ));
        }
        let body = &bytes[HEADER_LEN..];
        if body.len() % RECORD_LEN != 0 {
            return Err(corrupt(
                HEADER_LEN + body.len() / RECORD_LEN * RECORD_LEN,
                format!("partial record of {} bytes", body.len() % RECORD_LEN),
            ));
        }
        let mut index = Self::new(le_u64(&bytes[12..]));
        for (i, rec) in body.chunks_exact(RECORD_LEN).enumerate() {
            let offset = HEADER_LEN + i * RECORD_LEN;
            if crc32c::crc32c(&rec[..64]) != le_u32(&rec[64..]) {
                return Err(corrupt(offset, format!("record {i} checksum mismatch")));
            }
            let r = AbortedTxn {
                txn: (le_u64(&rec[0..]), le_u64(&rec[8..])),
                first: pos_at(rec, 16),
                last: pos_at(rec, 32),
                last_stable: pos_at(rec, 48),
            };
            index
                .check_next(&r)
                .map_err(|reason| corrupt(offset, format!("record {i}: {reason}")))?;
            index.records.push(r);
        }
        Ok(index)
    }

    /// True when the index holds exactly the given ABORT markers of its
    /// ledger (`(txn, marker position)` in log order): same transactions,
    /// same positions, nothing missing and nothing extra.
    pub fn matches(&self, aborts: &[((u64, u64), Position)]) -> bool {
        self.records.len() == aborts.len()
            && self
                .records
                .iter()
                .zip(aborts)
                .all(|(r, (txn, pos))| r.txn == *txn && r.last == *pos)
    }

    /// A new index from the ABORT markers found in the ledger, for an index
    /// that is missing or failed its checks. The markers give which
    /// transactions aborted and where; the ledger alone cannot tell where a
    /// transaction started (perhaps in an earlier ledger) or what was stable
    /// then, so the rebuilt records are conservative: `first` and
    /// `last_stable` are the lowest position. Readers then filter the right
    /// transactions and never stop early on a rebuilt record; they only may
    /// read a few more indexes. Markers are de-duplicated by position order
    /// (a repeated marker position is an error).
    pub fn rebuild(ledger_id: u64, aborts: &[((u64, u64), Position)]) -> Result<Self> {
        let mut index = Self::new(ledger_id);
        for (txn, pos) in aborts {
            index.append(AbortedTxn {
                txn: *txn,
                first: Position::new(0, 0),
                last: *pos,
                last_stable: Position::new(0, 0),
            })?;
        }
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(l: u64, e: u64) -> Position {
        Position::new(l, e)
    }

    fn rec(id: u64, first: Position, last: Position, lso: Position) -> AbortedTxn {
        AbortedTxn {
            txn: (0, id),
            first,
            last,
            last_stable: lso,
        }
    }

    #[test]
    fn empty_index_is_never_complete() {
        let i = AbortedTxnIndex::new(3);
        let c = i.collect(p(3, 0), p(3, 100));
        assert!(c.aborted.is_empty());
        assert!(!c.complete);
        assert!(i.is_empty());
    }

    #[test]
    fn four_overlapping_aborts_complete_for_a_narrow_fetch_not_a_wide_one() {
        // Four transactions interleaved in ledger 5; each ABORT's last-stable
        // position is the first position of the oldest transaction still open.
        let mut i = AbortedTxnIndex::new(5);
        i.append(rec(1, p(5, 0), p(5, 10), p(5, 0))).unwrap();
        i.append(rec(2, p(5, 2), p(5, 12), p(5, 2))).unwrap();
        i.append(rec(3, p(5, 4), p(5, 14), p(5, 4))).unwrap();
        i.append(rec(4, p(5, 15), p(5, 20), p(5, 15))).unwrap();
        // Fetch [5:3, 5:12): overlaps 1, 2 and 3; txn 4's record has
        // last_stable 5:15 >= 5:12, so nothing after it can overlap: complete.
        let narrow = i.collect(p(5, 3), p(5, 12));
        let ids: Vec<u64> = narrow.aborted.iter().map(|r| r.txn.1).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert!(narrow.complete);
        // Fetch [5:11, 5:30): 1 ended before it; 2, 3, 4 overlap; no record
        // reaches last_stable >= 5:30, so a later ledger may still hold one.
        let wide = i.collect(p(5, 11), p(5, 30));
        let ids: Vec<u64> = wide.aborted.iter().map(|r| r.txn.1).collect();
        assert_eq!(ids, vec![2, 3, 4]);
        assert!(!wide.complete);
        // A fetch entirely after every abort collects nothing, incomplete.
        let after = i.collect(p(5, 21), p(5, 40));
        assert!(after.aborted.is_empty() && !after.complete);
    }

    #[test]
    fn a_record_starting_at_the_upper_bound_is_excluded_but_completes() {
        let mut i = AbortedTxnIndex::new(1);
        i.append(rec(9, p(1, 5), p(1, 6), p(1, 5))).unwrap();
        let c = i.collect(p(1, 0), p(1, 5));
        assert!(c.aborted.is_empty());
        assert!(c.complete);
    }

    #[test]
    fn append_rules_name_the_bad_value() {
        let mut i = AbortedTxnIndex::new(2);
        i.append(rec(1, p(2, 0), p(2, 5), p(2, 0))).unwrap();
        let e = i.append(rec(2, p(2, 0), p(2, 5), p(2, 0))).unwrap_err();
        assert!(e.to_string().contains("2:5"), "{e}");
        let e = i.append(rec(2, p(2, 0), p(3, 5), p(2, 0))).unwrap_err();
        assert!(e.to_string().contains("not in ledger 2"), "{e}");
        let e = i.append(rec(2, p(2, 9), p(2, 7), p(2, 0))).unwrap_err();
        assert!(e.to_string().contains("first position 2:9"), "{e}");
        let e = i.append(rec(2, p(2, 1), p(2, 7), p(2, 8))).unwrap_err();
        assert!(e.to_string().contains("last-stable"), "{e}");
        assert_eq!(i.records().len(), 1);
    }

    #[test]
    fn bytes_round_trip_and_damage_is_detected() {
        let mut i = AbortedTxnIndex::new(7);
        i.append(rec(1, p(6, 3), p(7, 1), p(6, 3))).unwrap();
        i.append(rec(2, p(7, 2), p(7, 4), p(7, 2))).unwrap();
        let b = i.encode();
        assert_eq!(b.len(), HEADER_LEN + 2 * RECORD_LEN);
        assert_eq!(AbortedTxnIndex::decode(&b).unwrap(), i);
        for at in 0..b.len() {
            let mut d = b.clone();
            d[at] ^= 0x40;
            assert!(
                AbortedTxnIndex::decode(&d).is_err(),
                "flip at {at} not detected"
            );
        }
        let e = AbortedTxnIndex::decode(&b[..b.len() - 1]).unwrap_err();
        assert!(e.to_string().contains("partial record"), "{e}");
        // Records out of order, each with a valid checksum.
        let mut swapped = b[..HEADER_LEN].to_vec();
        swapped.extend_from_slice(&b[HEADER_LEN + RECORD_LEN..]);
        swapped.extend_from_slice(&b[HEADER_LEN..HEADER_LEN + RECORD_LEN]);
        let e = AbortedTxnIndex::decode(&swapped).unwrap_err();
        assert!(e.to_string().contains("does not follow"), "{e}");
        // Unknown version with a valid header checksum.
        let mut v2 = b.clone();
        v2[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&v2[..32]);
        v2[32..36].copy_from_slice(&crc.to_le_bytes());
        let e = AbortedTxnIndex::decode(&v2).unwrap_err();
        assert!(e.to_string().contains("unknown format version 2"), "{e}");
    }

    #[test]
    fn matches_and_rebuild() {
        let mut i = AbortedTxnIndex::new(4);
        i.append(rec(1, p(3, 0), p(4, 2), p(3, 0))).unwrap();
        assert!(i.matches(&[((0, 1), p(4, 2))]));
        assert!(!i.matches(&[((0, 1), p(4, 2)), ((0, 2), p(4, 9))]));
        assert!(!i.matches(&[((0, 2), p(4, 2))]));
        assert!(!i.matches(&[]));
        let r = AbortedTxnIndex::rebuild(4, &[((0, 1), p(4, 2)), ((0, 2), p(4, 9))]).unwrap();
        assert_eq!(r.records().len(), 2);
        // Conservative: a rebuilt record overlaps every fetch up to its marker
        // and never completes a collection.
        let c = r.collect(p(4, 0), p(4, 1));
        assert_eq!(c.aborted.len(), 2);
        assert!(!c.complete);
        assert!(r.sanity_check().is_ok());
        assert!(AbortedTxnIndex::rebuild(4, &[((0, 1), p(4, 2)), ((0, 2), p(4, 2))]).is_err());
    }
}
