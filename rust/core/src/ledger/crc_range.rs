//! crc32c of arbitrary byte ranges of a region in O(1) reads, from prefix
//! checkpoints, so the recovery search can test a candidate record of any
//! length without re-reading its payload.
//!
//! CRC arithmetic: for the crc32c `c(·)` (reflected, with pre/post
//! inversion), `c(A ++ B) = c(A)·x^(8|B|) mod P  xor  c(B)`. So
//! `c(B) = c(A ++ B) xor shift(c(A), |B|)`, and a range's crc follows from
//! two prefix crcs and one shift. A shift is a multiplication by
//! `x^(8n) mod P`, built from a table of `x^(2^k)` in O(popcount(n))
//! carry-less 32-bit multiplications.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The crc32c (Castagnoli) polynomial, bit-reflected.
const POLY: u32 = 0x82F6_3B78;

/// Distance between prefix checkpoints: a range crc reads and hashes at
/// most twice this many bytes.
pub const STEP: u64 = 256;

/// `a·b mod P` in the reflected representation (bit 31 is `x^0`).
fn mult_mod_p(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0u32;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// `x^(2^k) mod P` for k in 0..64.
fn x2n_table() -> &'static [u32; 64] {
    static TABLE: std::sync::OnceLock<[u32; 64]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0u32; 64];
        let mut p = 1u32 << 30; // x^1
        for e in &mut t {
            *e = p;
            p = mult_mod_p(p, p);
        }
        t
    })
}

/// `x^(8n) mod P`: the operator that appends `n` zero bytes.
fn x8n(n: u64) -> u32 {
    let t = x2n_table();
    let mut p = 1u32 << 31; // x^0
    let mut k = 3usize;
    let mut n = n;
    while n != 0 && k < 64 {
        if n & 1 != 0 {
            p = mult_mod_p(t[k], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// `c(A ++ B)` from `c(A)`, `c(B)` and `|B|` (like zlib's `crc32_combine`).
pub fn combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    mult_mod_p(x8n(len_b), crc_a) ^ crc_b
}

/// Prefix crcs of the file region `[base, end)` every [`STEP`] bytes.
#[derive(Debug)]
pub struct RangeCrc {
    base: u64,
    /// `cps[i]` = crc32c of `[base, base + i·STEP)`.
    cps: Vec<u32>,
    /// Running crc of everything fed so far and its length.
    crc: u32,
    len: u64,
}

impl RangeCrc {
    /// An empty region starting at file offset `base`.
    pub fn new(base: u64) -> Self {
        Self {
            base,
            cps: vec![0],
            crc: 0,
            len: 0,
        }
    }

    /// Feeds the next bytes of the region (any split).
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = (STEP - self.len % STEP) as usize;
            let n = room.min(data.len());
            self.crc = crc32c::crc32c_append(self.crc, &data[..n]);
            self.len += n as u64;
            if self.len % STEP == 0 {
                self.cps.push(self.crc);
            }
            data = &data[n..];
        }
    }

    /// End of the region fed so far.
    pub fn end(&self) -> u64 {
        self.base + self.len
    }

    /// crc32c of `[base, x)`; reads at most `STEP - 1` bytes of `file`.
    fn prefix(&self, file: &File, x: u64) -> io::Result<Option<u32>> {
        if x < self.base || x > self.end() {
            return Ok(None);
        }
        let i = (x - self.base) / STEP;
        let Some(&cp) = self.cps.get(i as usize) else {
            return Ok(None);
        };
        let start = self.base + i * STEP;
        let k = (x - start) as usize;
        if k == 0 {
            return Ok(Some(cp));
        }
        let mut buf = [0u8; STEP as usize];
        file.read_exact_at(&mut buf[..k], start)?;
        Ok(Some(crc32c::crc32c_append(cp, &buf[..k])))
    }

    /// crc32c of the file bytes `[a, b)` (inside the region), or `None`.
    pub fn range(&self, file: &File, a: u64, b: u64) -> io::Result<Option<u32>> {
        if a > b {
            return Ok(None);
        }
        let (Some(pa), Some(pb)) = (self.prefix(file, a)?, self.prefix(file, b)?) else {
            return Ok(None);
        };
        Ok(Some(pb ^ mult_mod_p(x8n(b - a), pa)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Write;

    #[test]
    fn combine_matches_direct_crc() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect();
        for split in [0usize, 1, 4, 255, 256, 257, 4999, 5000] {
            let (a, b) = data.split_at(split);
            let c = combine(crc32c::crc32c(a), crc32c::crc32c(b), b.len() as u64);
            assert_eq!(c, crc32c::crc32c(&data), "split {split}");
            assert_eq!(
                c,
                crc32c::crc32c_combine(crc32c::crc32c(a), crc32c::crc32c(b), b.len())
            );
        }
    }

    #[test]
    fn range_crc_matches_direct_crc() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 31 % 253) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[9u8; 100]).unwrap();
        f.write_all(&data).unwrap();
        let mut r = RangeCrc::new(100);
        for part in data.chunks(333) {
            r.feed(part);
        }
        assert_eq!(r.end(), 3100);
        for (a, b) in [
            (0, 0),
            (0, 3000),
            (1, 2),
            (255, 513),
            (256, 512),
            (17, 2999),
        ] {
            let got = r.range(&f, 100 + a, 100 + b).unwrap();
            assert_eq!(got, Some(crc32c::crc32c(&data[a as usize..b as usize])));
        }
        assert_eq!(r.range(&f, 99, 200).unwrap(), None);
        assert_eq!(r.range(&f, 100, 3101).unwrap(), None);
    }
}
