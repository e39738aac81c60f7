//! A bounds-checked, allocation-free reader of protobuf wire data.
//!
//! The frame codec and the columnar decoders walk messages field by field
//! with it, so hot decode paths copy bytes straight into their output
//! columns instead of building a message object per record.

use crate::error::{Error, Result};
use std::ops::RangeInclusive;

/// A varint never takes more than this many bytes.
const MAX_VARINT_LEN: usize = 10;

/// Bytes a varint of `v` takes.
#[inline]
pub fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Appends `v` as a varint.
#[inline]
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A proto2 enum field's varint as one of the enum's values `known`, or
/// `None` for a value outside the enum.
///
/// proto2 enums are closed: a parser keeps an unknown value as an unknown
/// field and the field itself as it was (an earlier valid value stays,
/// absent stays absent), so callers assign only `Some`. The value is the
/// varint's low 32 bits read as an `int32`, as protobuf reads enums (a
/// negative value is ten bytes on the wire).
#[inline]
pub fn enum_value(v: u64, known: RangeInclusive<i8>) -> Option<i8> {
    i8::try_from(v as u32 as i32)
        .ok()
        .filter(|e| known.contains(e))
}

/// The error for a known field carrying the wrong wire type.
pub fn wrong_type(field: u32, at: usize) -> Error {
    Error::corrupt_entry(at, format!("field {field} has an unexpected wire type"))
}

/// Checks that a string field is UTF-8 (as protobuf requires).
pub fn utf8(b: &[u8], at: usize) -> Result<&str> {
    std::str::from_utf8(b)
        .map_err(|e| Error::corrupt_entry(at, format!("invalid UTF-8 in string field: {e}")))
}

/// One field's value as it appears on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

/// Cursor over a protobuf-encoded buffer. Offsets in errors are relative
/// to `base` + the start of `buf`, so nested readers report entry offsets.
#[derive(Debug)]
pub struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Wire<'a> {
    /// Reads `buf` from `start`; error offsets are reported as `base + pos`.
    pub fn new(buf: &'a [u8], start: usize, base: usize) -> Self {
        Self {
            buf,
            pos: start,
            base,
        }
    }

    /// True when every byte was consumed.
    pub fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn err(&self, at: usize, reason: impl Into<String>) -> Error {
        Error::corrupt_entry(self.base + at, reason)
    }

    /// Reads one varint.
    #[inline]
    pub fn varint(&mut self) -> Result<u64> {
        let start = self.pos;
        // Fast path: one-byte varints (small ids, enums, lengths < 128).
        if let Some(&b) = self.buf.get(start) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
        }
        let mut v: u64 = 0;
        for i in 0..MAX_VARINT_LEN {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.err(start, "truncated varint"));
            };
            self.pos += 1;
            if i == MAX_VARINT_LEN - 1 && b > 1 {
                return Err(self.err(start, "varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7F) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(self.err(start, "varint longer than 10 bytes"))
    }

    fn take(&mut self, len: u64, field_at: usize) -> Result<&'a [u8]> {
        let remaining = self.buf.len() - self.pos;
        if len > remaining as u64 {
            return Err(self.err(
                field_at,
                format!("length {len} runs past the end ({remaining} bytes left)"),
            ));
        }
        let s = &self.buf[self.pos..self.pos + len as usize];
        self.pos += len as usize;
        Ok(s)
    }

    /// Reads the next field: `(field_number, value, offset_of_field)`, or
    /// `None` at the end. Groups (wire types 3/4) and wire types 6/7 are
    /// corrupt: no txnstream message uses them.
    #[inline]
    pub fn next_field(&mut self) -> Result<Option<(u32, Value<'a>, usize)>> {
        if self.at_end() {
            return Ok(None);
        }
        let at = self.pos;
        // Fast path: single-byte keys (fields 1..15) are the common case.
        let key = match self.buf[self.pos] {
            b if b < 0x80 => {
                self.pos += 1;
                u64::from(b)
            }
            _ => self.varint()?,
        };
        let (field, wire_type) = (key >> 3, key & 7);
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return Err(self.err(at, format!("invalid field number {field}")));
        }
        let value = match wire_type {
            0 => Value::Varint(self.varint()?),
            1 => {
                let b = self.take(8, at)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Value::Fixed64(u64::from_le_bytes(a))
            }
            2 => {
                let len = self.varint()?;
                Value::Bytes(self.take(len, at)?)
            }
            5 => {
                let b = self.take(4, at)?;
                let mut a = [0u8; 4];
                a.copy_from_slice(b);
                Value::Fixed32(u32::from_le_bytes(a))
            }
            other => {
                return Err(self.err(
                    at,
                    format!("unsupported wire type {other} for field {field}"),
                ))
            }
        };
        Ok(Some((field as u32, value, at)))
    }

    /// Absolute offset (for nested readers) of the current position.
    pub fn offset(&self) -> usize {
        self.base + self.pos
    }
}
