//! A closed ledger as uploaded to remote storage: the segment data and its
//! offset index.
//!
//! The data is the ledger's entries back to back, each framed as
//! `len u32 | crc32c u32 | bytes` (little endian), so a whole segment is read
//! and checked with one remote call and no index ([`decode_frames`]). The
//! offset index maps each entry id to its frame, for ranged reads of a few
//! entries. Its bytes (little endian):
//! ```text
//! header 48 B: magic "TSSEGIX1" | version u32 (=1) | ledger_id u64 | first_entry u64
//!              | entry_count u64 | data_len u64 | crc32c u32 of the 44 bytes before
//! slot   16 B: offset u64 | len u32 | crc32c u32 of the entry's bytes   (one per entry)
//! footer  4 B: crc32c u32 of all the slots
//! ```
//! `offset` is where the entry's frame starts, `len` the entry's length
//! without the 8-byte frame header.

use crate::error::{Error, Result};
use crate::ledger::journal::{le_u32, le_u64};

/// Magic bytes that open every offset index.
pub const MAGIC: &[u8; 8] = b"TSSEGIX1";
/// The only format version this build reads and writes.
pub const VERSION: u32 = 1;
/// Size of the header in bytes.
pub const HEADER_LEN: usize = 48;
/// Size of one entry slot in bytes.
pub const SLOT_LEN: usize = 16;

/// Where one entry lies in the segment data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Byte offset in the data.
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
    /// crc32c of the entry's bytes.
    pub crc: u32,
}

/// The offset index of one uploaded segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentIndex {
    /// The ledger the segment holds.
    pub ledger_id: u64,
    /// Entry id of the first entry (entries that were trimmed are not uploaded).
    pub first_entry: u64,
    /// Total size of the data in bytes.
    pub data_len: u64,
    slots: Vec<Slot>,
}

fn corrupt(offset: usize, reason: impl Into<String>) -> Error {
    Error::CorruptIndex {
        kind: "segment offset index".into(),
        offset,
        reason: reason.into(),
    }
}

/// Size of an entry's frame header in the data.
pub const FRAME_LEN: usize = 8;

/// Splits segment data (whole, or a run of frames starting at a frame
/// boundary) into entries, checking each frame's checksum. `first` is the
/// entry id of the first frame, used to name a damaged entry.
pub fn decode_frames(ledger_id: u64, first: u64, data: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let id = first.wrapping_add(out.len() as u64); // names the entry only
        let damaged = |reason: String| Error::CorruptEntry {
            position: Some(crate::Position::new(ledger_id, id)),
            offset: at,
            reason,
        };
        if data.len() - at < FRAME_LEN {
            return Err(damaged(format!(
                "{} bytes left, less than a frame header",
                data.len() - at
            )));
        }
        let len = le_u32(&data[at..]) as usize;
        let crc = le_u32(&data[at + 4..]);
        let start = at + FRAME_LEN;
        let Some(end) = start.checked_add(len).filter(|&e| e <= data.len()) else {
            return Err(damaged(format!(
                "frame of {len} bytes runs past the end of the data"
            )));
        };
        let e = &data[start..end];
        if crc32c::crc32c(e) != crc {
            return Err(damaged("remote segment entry checksum mismatch".into()));
        }
        out.push(e);
        at = end;
    }
    Ok(out)
}

/// Builds the data and the offset index of a segment from its entries, in
/// entry-id order starting at `first_entry`.
pub fn encode_segment<'a>(
    ledger_id: u64,
    first_entry: u64,
    entries: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(Vec<u8>, SegmentIndex)> {
    let mut data = Vec::new();
    let mut slots = Vec::new();
    for e in entries {
        let len = u32::try_from(e.len())
            .map_err(|_| Error::invalid(format!("entry of {} bytes is too large", e.len())))?;
        let crc = crc32c::crc32c(e);
        slots.push(Slot {
            offset: data.len() as u64,
            len,
            crc,
        });
        data.extend_from_slice(&len.to_le_bytes());
        data.extend_from_slice(&crc.to_le_bytes());
        data.extend_from_slice(e);
    }
    let index = SegmentIndex {
        ledger_id,
        first_entry,
        data_len: data.len() as u64,
        slots,
    };
    Ok((data, index))
}

impl SegmentIndex {
    /// Number of entries in the segment.
    pub fn entry_count(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Entry id of the last entry, if any.
    pub fn last_entry(&self) -> Option<u64> {
        (self.entry_count() > 0).then(|| self.first_entry + self.entry_count() - 1)
    }

    /// The slot of `entry_id`, or `PositionNotFound`-style `InvalidArgument`
    /// when the segment does not hold it.
    pub fn slot(&self, entry_id: u64) -> Result<Slot> {
        entry_id
            .checked_sub(self.first_entry)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.slots.get(i).copied())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "entry {entry_id} is not in the segment of ledger {} (entries {}..{})",
                    self.ledger_id,
                    self.first_entry,
                    self.first_entry + self.entry_count()
                ))
            })
    }

    /// The byte range `[start, end)` in the data covering the frames of
    /// entries `from..=to`.
    pub fn range(&self, from: u64, to: u64) -> Result<(u64, u64)> {
        if to < from {
            return Err(Error::invalid(format!(
                "entry range {from}..={to} is empty"
            )));
        }
        let a = self.slot(from)?;
        let b = self.slot(to)?;
        Ok((a.offset, b.offset + FRAME_LEN as u64 + u64::from(b.len)))
    }

    /// Splits the frames fetched for entries `from..` (see [`Self::range`])
    /// into entries, checking each against its frame and its slot.
    pub fn split<'a>(&self, from: u64, bytes: &'a [u8]) -> Result<Vec<&'a [u8]>> {
        let entries = decode_frames(self.ledger_id, from, bytes)?;
        for (i, e) in entries.iter().enumerate() {
            let id = from
                .checked_add(i as u64)
                .ok_or_else(|| Error::invalid(format!("entry id {from} + {i} overflows")))?;
            let s = self.slot(id)?;
            if s.len as usize != e.len() || s.crc != crc32c::crc32c(e) {
                return Err(Error::CorruptEntry {
                    position: Some(crate::Position::new(self.ledger_id, id)),
                    offset: 0,
                    reason: "remote segment entry does not match its offset index".into(),
                });
            }
        }
        Ok(entries)
    }

    /// The index as bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.slots.len() * SLOT_LEN + 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.ledger_id.to_le_bytes());
        out.extend_from_slice(&self.first_entry.to_le_bytes());
        out.extend_from_slice(&self.entry_count().to_le_bytes());
        out.extend_from_slice(&self.data_len.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        let body_start = out.len();
        for s in &self.slots {
            out.extend_from_slice(&s.offset.to_le_bytes());
            out.extend_from_slice(&s.len.to_le_bytes());
            out.extend_from_slice(&s.crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out[body_start..]);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks an index: header and body checksums, slots
    /// contiguous from offset 0 and ending at `data_len`.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < HEADER_LEN + 4 {
            return Err(corrupt(0, format!("{} bytes is too short", bytes.len())));
        }
        if &bytes[..8] != MAGIC {
            return Err(corrupt(0, "bad magic (not a segment offset index)"));
        }
        if crc32c::crc32c(&bytes[..44]) != le_u32(&bytes[44..]) {
            return Err(corrupt(44, "header checksum mismatch"));
        }
        let version = le_u32(&bytes[8..]);
        if version != VERSION {
            return Err(corrupt(
                8,
                format!("unknown format version {version} (this build reads {VERSION})"),
            ));
        }
        let ledger_id = le_u64(&bytes[12..]);
        let first_entry = le_u64(&bytes[20..]);
        let count = le_u64(&bytes[28..]);
        let data_len = le_u64(&bytes[36..]);
        let body = &bytes[HEADER_LEN..bytes.len() - 4];
        let expected = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(SLOT_LEN))
            .ok_or_else(|| corrupt(28, format!("entry count {count} is too large")))?;
        if body.len() != expected {
            return Err(corrupt(
                HEADER_LEN,
                format!("{} slot bytes for {count} entries", body.len()),
            ));
        }
        if crc32c::crc32c(body) != le_u32(&bytes[bytes.len() - 4..]) {
            return Err(corrupt(bytes.len() - 4, "slot checksum mismatch"));
        }
        if first_entry.checked_add(count).is_none() {
            return Err(corrupt(20, "entry ids overflow"));
        }
        let mut slots = Vec::with_capacity(body.len() / SLOT_LEN);
        let mut next = 0u64;
        for (i, s) in body.chunks_exact(SLOT_LEN).enumerate() {
            let slot = Slot {
                offset: le_u64(&s[0..]),
                len: le_u32(&s[8..]),
                crc: le_u32(&s[12..]),
            };
            if slot.offset != next {
                return Err(corrupt(
                    HEADER_LEN + i * SLOT_LEN,
                    format!("slot {i} starts at {} instead of {next}", slot.offset),
                ));
            }
            next = slot.offset + FRAME_LEN as u64 + u64::from(slot.len);
            slots.push(slot);
        }
        if next != data_len {
            return Err(corrupt(
                36,
                format!("slots end at {next}, data is {data_len} bytes"),
            ));
        }
        Ok(Self {
            ledger_id,
            first_entry,
            data_len,
            slots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_ranges_and_checks() {
        let entries: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; i as usize * 3 + 1]).collect();
        let (data, idx) = encode_segment(9, 10, entries.iter().map(|e| e.as_slice())).unwrap();
        let b = idx.encode();
        let back = SegmentIndex::decode(&b).unwrap();
        assert_eq!(back, idx);
        assert_eq!(back.last_entry(), Some(14));
        let (s, e) = back.range(11, 13).unwrap();
        let got = back.split(11, &data[s as usize..e as usize]).unwrap();
        assert_eq!(got, vec![&entries[1][..], &entries[2][..], &entries[3][..]]);
        assert!(back.slot(9).is_err() && back.slot(15).is_err());
        let all = decode_frames(9, 10, &data).unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all[4], &entries[4][..]);
        assert!(decode_frames(9, 10, &data[..data.len() - 1]).is_err());
        let mut bad = data.clone();
        bad[s as usize + FRAME_LEN] ^= 1;
        assert!(back.split(11, &bad[s as usize..e as usize]).is_err());
        for at in 0..b.len() {
            let mut d = b.clone();
            d[at] ^= 0x10;
            assert!(
                SegmentIndex::decode(&d).is_err(),
                "flip at {at} not detected"
            );
        }
        assert!(SegmentIndex::decode(&b[..b.len() - 1]).is_err());
    }
}
