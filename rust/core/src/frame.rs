//! Batched-entry framing (PIP-160).
//!
//! A batched entry is `MAGIC (u16 BE) | VERSION (u16 BE) | protobuf`, where
//! the protobuf is a `Batched*` message whose records all sit in field 1 as
//! length-delimited bytes. Because both `Batched*` messages share that shape,
//! this codec never needs the record schema. An unbatched entry is the bare
//! record: it starts with the tag byte of field 1 (0x08), never with 0x0E.

use crate::error::{Error, Result};
use crate::wire::{put_varint, varint_len, Value, Wire};

/// First two bytes of every batched entry.
pub const MAGIC: u16 = 0x0E01;
/// The only batch format version this build reads and writes.
pub const VERSION: u16 = 0x0001;
/// Bytes taken by magic + version.
pub const HEADER_LEN: usize = 4;
/// Key of field 1, wire type 2 (length-delimited).
const RECORD_KEY: u8 = 0x0A;

/// True when `entry` starts with the batch magic.
#[inline]
pub fn is_batched(entry: &[u8]) -> bool {
    entry.len() >= 2 && u16::from_be_bytes([entry[0], entry[1]]) == MAGIC
}

/// Exact size of the batched entry holding records of these lengths.
pub fn encoded_len<I: IntoIterator<Item = usize>>(lens: I) -> usize {
    HEADER_LEN
        + lens
            .into_iter()
            .map(|l| 1 + varint_len(l as u64) + l)
            .sum::<usize>()
}

/// Starts a batched entry in `out` (magic + version); follow with [`push_record`].
pub fn begin_batch(out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.extend_from_slice(&VERSION.to_be_bytes());
}

/// Appends one record (field 1, length-delimited) to a batch begun by [`begin_batch`].
#[inline]
pub fn push_record(out: &mut Vec<u8>, record: &[u8]) {
    out.push(RECORD_KEY);
    put_varint(out, record.len() as u64);
    out.extend_from_slice(record);
}

/// Appends the batched entry for `records` to `out`.
pub fn encode_batch_into<R: AsRef<[u8]>>(records: &[R], out: &mut Vec<u8>) {
    out.reserve(encoded_len(records.iter().map(|r| r.as_ref().len())));
    begin_batch(out);
    for r in records {
        push_record(out, r.as_ref());
    }
}

/// Writes the batched entry for `records` into `buf`, which must be exactly
/// [`encoded_len`] bytes (e.g. a freshly allocated Python `bytes`).
pub fn encode_batch_to<R: AsRef<[u8]>>(records: &[R], buf: &mut [u8]) -> Result<()> {
    if records.is_empty() {
        return Err(Error::invalid("a batched entry needs at least one record"));
    }
    let need = encoded_len(records.iter().map(|r| r.as_ref().len()));
    if buf.len() != need {
        return Err(Error::invalid(format!(
            "encode buffer is {} bytes, batch needs {need}",
            buf.len()
        )));
    }
    buf[..2].copy_from_slice(&MAGIC.to_be_bytes());
    buf[2..4].copy_from_slice(&VERSION.to_be_bytes());
    let mut at = HEADER_LEN;
    for r in records {
        let r = r.as_ref();
        buf[at] = RECORD_KEY;
        at += 1;
        let mut v = r.len() as u64;
        while v >= 0x80 {
            buf[at] = (v as u8) | 0x80;
            v >>= 7;
            at += 1;
        }
        buf[at] = v as u8;
        at += 1;
        buf[at..at + r.len()].copy_from_slice(r);
        at += r.len();
    }
    Ok(())
}

/// Builds the batched entry for `records` (callers never pass an empty list:
/// an empty batch is not a valid entry, see [`for_each_record`]).
pub fn encode_batch<R: AsRef<[u8]>>(records: &[R]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_batch_into(records, &mut out);
    out
}

/// Calls `f` with every record of `entry` (one call for an unbatched entry)
/// and returns how many there were. Records borrow from `entry`.
pub fn for_each_record<'a, F: FnMut(&'a [u8])>(entry: &'a [u8], mut f: F) -> Result<usize> {
    if !is_batched(entry) {
        f(entry);
        return Ok(1);
    }
    if entry.len() < HEADER_LEN {
        return Err(Error::corrupt_entry(
            entry.len(),
            "truncated batch header (magic without version)",
        ));
    }
    let version = u16::from_be_bytes([entry[2], entry[3]]);
    if version != VERSION {
        return Err(Error::corrupt_entry(
            2,
            format!("unknown batch version {version:#06x}"),
        ));
    }
    let mut w = Wire::new(entry, HEADER_LEN, 0);
    let mut n = 0;
    while let Some((field, value, at)) = w.next_field()? {
        // Field 1 holds the records; other fields are skipped (forward compatible).
        match (field, value) {
            (1, Value::Bytes(data)) => {
                f(data);
                n += 1;
            }
            (1, _) => {
                return Err(Error::corrupt_entry(
                    at,
                    "field 1 (records) is not length-delimited",
                ))
            }
            _ => {}
        }
    }
    if n == 0 {
        // Writers never produce an empty batch; treat one as damage, not as "no records".
        return Err(Error::corrupt_entry(
            entry.len(),
            "batched entry holds no records",
        ));
    }
    Ok(n)
}

/// Splits an entry into its records (borrowed). An unbatched entry is one record.
pub fn decode_entry(entry: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    for_each_record(entry, |r| out.push(r))?;
    Ok(out)
}

/// Where each record of a bulk decode came from: record `i` is record
/// `batch_index[i]` of the `batch_size[i]` in input entry `entry_index[i]`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecordOrigin {
    /// Index of the entry in the input.
    pub entry_index: Vec<u32>,
    /// Index within the entry.
    pub batch_index: Vec<u32>,
    /// Records in that entry (1 for unbatched entries).
    pub batch_size: Vec<u32>,
}

impl RecordOrigin {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.entry_index.len()
    }

    /// True when there are no records.
    pub fn is_empty(&self) -> bool {
        self.entry_index.is_empty()
    }

    /// Records the `n` records of input entry `entry`.
    pub fn push_entry(&mut self, entry: usize, n: usize) -> Result<()> {
        let entry = u32::try_from(entry).map_err(|_| Error::invalid("too many entries"))?;
        let n32 = u32::try_from(n).map_err(|_| Error::invalid("entry holds over 4G records"))?;
        self.entry_index.extend(std::iter::repeat_n(entry, n));
        self.batch_index.extend(0..n32);
        self.batch_size.extend(std::iter::repeat_n(n32, n));
        Ok(())
    }
}

/// Records of many entries, flattened Arrow-style: record `i` is
/// `data[offsets[i]..offsets[i + 1]]`, from `origin` entry/index `i`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FlatRecords {
    /// All record bytes back to back.
    pub data: Vec<u8>,
    /// `n + 1` offsets into `data`.
    pub offsets: Vec<i64>,
    /// Where each record came from.
    pub origin: RecordOrigin,
}

impl FlatRecords {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.origin.len()
    }

    /// True when there are no records.
    pub fn is_empty(&self) -> bool {
        self.origin.is_empty()
    }

    /// Record `i`.
    pub fn record(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

/// The buffer for the records of `entries`: their bytes never exceed the
/// entries' total size, so it is reserved once, up front. The total is the
/// caller's to choose (a Python list may hold one large `bytes` object many
/// times over): a size that cannot be allocated is an error, not an abort.
fn records_buffer<E: AsRef<[u8]>>(entries: &[E]) -> Result<Vec<u8>> {
    let total = entries
        .iter()
        .try_fold(0usize, |sum, e| sum.checked_add(e.as_ref().len()));
    let mut data = Vec::new();
    match total {
        Some(total) if data.try_reserve_exact(total).is_ok() => Ok(data),
        _ => Err(Error::invalid(format!(
            "the {} entries hold {} bytes in all: more than can be allocated for their \
             records; decode them in smaller calls",
            entries.len(),
            total.map_or_else(|| "over 2**64".to_owned(), |t| t.to_string())
        ))),
    }
}

/// Decodes many entries in one pass into [`FlatRecords`]. A corrupt entry
/// fails the whole call with an error naming its index in `entries`.
pub fn decode_entries<E: AsRef<[u8]>>(entries: &[E]) -> Result<FlatRecords> {
    let mut out = FlatRecords {
        data: records_buffer(entries)?,
        offsets: Vec::with_capacity(entries.len() + 1),
        ..Default::default()
    };
    out.offsets.push(0);
    for (idx, e) in entries.iter().enumerate() {
        let n = for_each_record(e.as_ref(), |r| {
            out.data.extend_from_slice(r);
            out.offsets.push(out.data.len() as i64);
        })
        .map_err(|err| with_entry_index(err, idx))?;
        out.origin.push_entry(idx, n)?;
    }
    Ok(out)
}

/// The records of a column of entries, for a UDF returning one list per
/// entry: entry `i` holds records `entry_offsets[i]..entry_offsets[i + 1]`
/// of `flat` (record indexes); a malformed entry holds none and has
/// `failed[i]` set, so one bad entry does not fail the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryLists {
    /// Every record of every good entry.
    pub flat: FlatRecords,
    /// `n + 1` offsets into the records (Arrow `list` layout, int32).
    pub entry_offsets: Vec<i32>,
    /// Entries that could not be split into records.
    pub failed: Vec<bool>,
}

/// Splits every entry into its records (see [`EntryLists`]).
pub fn decode_entry_lists<E: AsRef<[u8]>>(entries: &[E]) -> Result<EntryLists> {
    let mut flat = FlatRecords {
        data: records_buffer(entries)?,
        offsets: Vec::with_capacity(entries.len() + 1),
        ..Default::default()
    };
    flat.offsets.push(0);
    let mut entry_offsets = Vec::with_capacity(entries.len() + 1);
    entry_offsets.push(0i32);
    let mut failed = Vec::with_capacity(entries.len());
    for (idx, e) in entries.iter().enumerate() {
        let (data_len, records) = (flat.data.len(), flat.offsets.len());
        let r = for_each_record(e.as_ref(), |r| {
            flat.data.extend_from_slice(r);
            flat.offsets.push(flat.data.len() as i64);
        });
        match r {
            Ok(n) => {
                flat.origin.push_entry(idx, n)?;
                failed.push(false);
            }
            Err(_) => {
                // Drop what the entry yielded before its damage showed.
                flat.data.truncate(data_len);
                flat.offsets.truncate(records);
                failed.push(true);
            }
        }
        entry_offsets.push(
            i32::try_from(flat.len())
                .map_err(|_| Error::invalid("more than 2^31 records in one call"))?,
        );
    }
    Ok(EntryLists {
        flat,
        entry_offsets,
        failed,
    })
}

/// Prefixes a `CorruptEntry` reason with the entry's index in a bulk call.
pub(crate) fn with_entry_index(err: Error, idx: usize) -> Error {
    match err {
        Error::CorruptEntry {
            position,
            offset,
            reason,
        } => Error::CorruptEntry {
            position,
            offset,
            reason: format!("entry #{idx}: {reason}"),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layout() {
        let recs: Vec<&[u8]> = vec![b"\x08\x01", b"", b"abc"];
        let e = encode_batch(&recs);
        assert_eq!(&e[..4], &[0x0E, 0x01, 0x00, 0x01]);
        assert_eq!(e.len(), encoded_len(recs.iter().map(|r| r.len())));
        assert_eq!(decode_entry(&e).unwrap(), recs);
        let mut buf = vec![0; e.len()];
        encode_batch_to(&recs, &mut buf).unwrap();
        assert_eq!(buf, e);
        assert!(encode_batch_to(&recs, &mut [0; 3]).is_err());
        assert!(encode_batch_to::<&[u8]>(&[], &mut [0; 4]).is_err());
    }

    #[test]
    fn unbatched_is_one_record() {
        assert_eq!(
            decode_entry(b"\x08\x05").unwrap(),
            vec![b"\x08\x05".as_slice()]
        );
        assert_eq!(decode_entry(b"").unwrap(), vec![b"".as_slice()]);
        assert_eq!(decode_entry(b"\x0e").unwrap(), vec![b"\x0e".as_slice()]);
    }

    #[test]
    fn malformed() {
        let cases: &[(&[u8], usize)] = &[
            (b"\x0e\x01", 2),
            (b"\x0e\x01\x00", 3),
            (b"\x0e\x01\x00\x02", 2),
            (b"\x0e\x01\x00\x01\x0a\x05ab", 4),
            (b"\x0e\x01\x00\x01\x0a", 5),
            (
                b"\x0e\x01\x00\x01\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f",
                5,
            ),
            (b"\x0e\x01\x00\x01\x0b", 4),
            (b"\x0e\x01\x00\x01\x00", 4),
            (b"\x0e\x01\x00\x01\x08\x01", 4),
            (b"\x0e\x01\x00\x01", 4),
            (b"\x0e\x01\x00\x01\x10\x01", 6),
        ];
        for (bytes, off) in cases {
            match decode_entry(bytes) {
                Err(Error::CorruptEntry { offset, .. }) => assert_eq!(offset, *off, "{bytes:?}"),
                other => panic!("{bytes:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_fields_are_skipped() {
        // field 2 varint, field 3 fixed64, field 4 fixed32, then a record.
        let mut e = vec![0x0E, 0x01, 0x00, 0x01, 0x10, 0x96, 0x01, 0x19];
        e.extend_from_slice(&[0; 8]);
        e.push(0x25);
        e.extend_from_slice(&[0; 4]);
        e.extend_from_slice(&[0x0A, 0x01, 0x08]);
        assert_eq!(decode_entry(&e).unwrap(), vec![b"\x08".as_slice()]);
    }

    #[test]
    fn entry_lists_skip_only_the_bad_entry() {
        let good = encode_batch(&[b"x".as_slice(), b"yy"]);
        // Two records, then a truncated third one.
        let mut bad = encode_batch(&[b"p".as_slice(), b"q"]);
        bad.extend_from_slice(b"\x0a\x05ab");
        let l = decode_entry_lists(&[good.as_slice(), &bad, b"\x08\x02"]).unwrap();
        assert_eq!(l.failed, vec![false, true, false]);
        assert_eq!(l.entry_offsets, vec![0, 2, 2, 3]);
        assert_eq!(l.flat.len(), 3);
        assert_eq!(l.flat.record(1), b"yy");
        assert_eq!(l.flat.record(2), b"\x08\x02");
        assert_eq!(l.flat.origin.entry_index, vec![0, 0, 2]);
    }

    #[test]
    fn an_impossible_total_is_an_error_not_an_abort() {
        // One entry seen many times: 2**20 * 2**30 bytes (a PiB) cannot be
        // reserved. (The zeroed GiB is mapped, never touched.)
        let big = vec![0u8; 1 << 30];
        let entries: Vec<&[u8]> = vec![&big; 1 << 20];
        for err in [
            decode_entries(&entries).err(),
            decode_entry_lists(&entries).err(),
        ] {
            assert!(
                matches!(&err, Some(Error::InvalidArgument(m)) if m.contains("1125899906842624 bytes")),
                "{err:?}"
            );
        }
    }

    #[test]
    fn bulk_matches_single() {
        let a = encode_batch(&[b"x".as_slice(), b"yy"]);
        let b = b"\x08\x02".to_vec();
        let flat = decode_entries(&[a, b]).unwrap();
        assert_eq!(flat.len(), 3);
        assert_eq!(flat.record(1), b"yy");
        assert_eq!(flat.record(2), b"\x08\x02");
        assert_eq!(flat.origin.entry_index, vec![0, 0, 1]);
        assert_eq!(flat.origin.batch_index, vec![0, 1, 0]);
        assert_eq!(flat.origin.batch_size, vec![2, 2, 1]);
    }
}
