//! Batch-index ack sets (PIP-54 / PIP-160 batch-index deletion).
//!
//! Layout is Java `BitSet.toLongArray()`: bit `i` lives in word `i / 64` at
//! bit `i % 64`, words are signed 64-bit on the wire, and trailing all-zero
//! words are dropped. Bit = 1 means "still present", 0 means "deleted".

use crate::error::{Error, Result};

/// Largest batch an ack set may describe (bounds memory taken from input).
pub const MAX_BATCH_SIZE: u32 = 1 << 20;

/// The present/deleted state of the records of one batched entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AckSet {
    words: Vec<u64>,
    batch_size: u32,
}

fn words_for(batch_size: u32) -> usize {
    (batch_size as usize).div_ceil(64)
}

fn check_batch_size(batch_size: i64) -> Result<u32> {
    if batch_size < 1 || batch_size > i64::from(MAX_BATCH_SIZE) {
        return Err(Error::invalid(format!(
            "batch_size must be in 1..={MAX_BATCH_SIZE}, got {batch_size}"
        )));
    }
    Ok(batch_size as u32)
}

impl AckSet {
    /// All `batch_size` records present.
    pub fn new(batch_size: i64) -> Result<Self> {
        let batch_size = check_batch_size(batch_size)?;
        let mut words = vec![u64::MAX; words_for(batch_size)];
        let tail = batch_size % 64;
        if tail != 0 {
            if let Some(last) = words.last_mut() {
                *last = (1u64 << tail) - 1;
            }
        }
        Ok(Self { words, batch_size })
    }

    /// The set with every record present except `index` — what an ack of one
    /// record of a batch carries.
    pub fn single_deleted(batch_size: i64, index: i64) -> Result<Self> {
        let mut s = Self::new(batch_size)?;
        s.clear(index)?;
        Ok(s)
    }

    /// Rebuilds a set from `toLongArray()` words. Bits at or beyond
    /// `batch_size` must be zero.
    pub fn from_words(words: &[i64], batch_size: i64) -> Result<Self> {
        let batch_size = check_batch_size(batch_size)?;
        let n = words_for(batch_size);
        let mut out = vec![0u64; n];
        for (i, &w) in words.iter().enumerate() {
            let w = w as u64;
            let allowed = if i < n {
                let top = batch_size as usize - i * 64;
                if top >= 64 {
                    u64::MAX
                } else {
                    (1u64 << top) - 1
                }
            } else {
                0
            };
            if w & !allowed != 0 {
                return Err(Error::invalid(format!(
                    "ack set word {i} ({}) has bits at or beyond batch_size {batch_size}",
                    w as i64
                )));
            }
            if i < n {
                out[i] = w;
            }
        }
        Ok(Self {
            words: out,
            batch_size,
        })
    }

    /// Number of records in the batch.
    pub fn batch_size(&self) -> u32 {
        self.batch_size
    }

    fn check_index(&self, index: i64) -> Result<usize> {
        if index < 0 || index >= i64::from(self.batch_size) {
            return Err(Error::invalid(format!(
                "batch index {index} out of range for batch_size {}",
                self.batch_size
            )));
        }
        Ok(index as usize)
    }

    /// Marks record `index` deleted.
    pub fn clear(&mut self, index: i64) -> Result<()> {
        let i = self.check_index(index)?;
        self.words[i / 64] &= !(1u64 << (i % 64));
        Ok(())
    }

    /// True when record `index` is still present.
    pub fn get(&self, index: i64) -> Result<bool> {
        let i = self.check_index(index)?;
        Ok(self.words[i / 64] >> (i % 64) & 1 == 1)
    }

    /// True when every record is deleted (the entry can go whole).
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// Number of records still present.
    pub fn cardinality(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    fn same_size(&self, other: &Self) -> Result<()> {
        if self.batch_size != other.batch_size {
            return Err(Error::invalid(format!(
                "ack sets of different batch sizes: {} and {}",
                self.batch_size, other.batch_size
            )));
        }
        Ok(())
    }

    /// True when some record is deleted in both sets — two acks that claim
    /// the same batch index (the pending-ack conflict rule).
    pub fn overlaps(&self, other: &Self) -> Result<bool> {
        self.same_size(other)?;
        let full = Self::new(i64::from(self.batch_size))?;
        Ok(self
            .words
            .iter()
            .zip(&other.words)
            .zip(&full.words)
            .any(|((a, b), f)| !a & !b & f != 0))
    }

    /// Merges deletions: a record stays present only if present in both.
    pub fn and_assign(&mut self, other: &Self) -> Result<()> {
        self.same_size(other)?;
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= b;
        }
        Ok(())
    }

    /// Java `BitSet.toLongArray()`: signed words, trailing zero words dropped.
    pub fn to_words(&self) -> Vec<i64> {
        let used = self
            .words
            .iter()
            .rposition(|&w| w != 0)
            .map_or(0, |i| i + 1);
        self.words[..used].iter().map(|&w| w as i64).collect()
    }

    /// Indexes of the records still present, ascending.
    pub fn present(&self) -> Vec<u32> {
        (0..self.batch_size)
            .filter(|&i| self.words[i as usize / 64] >> (i % 64) & 1 == 1)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn java(n: i64, i: i64) -> Vec<i64> {
        AckSet::single_deleted(n, i).unwrap().to_words()
    }

    #[test]
    fn java_bitset_compat() {
        assert_eq!(java(10, 5), vec![0b11_1101_1111]);
        assert_eq!(java(64, 0), vec![-2]);
        assert_eq!(java(64, 63), vec![i64::MAX]);
        assert_eq!(
            java(230, 120),
            vec![-1, !(1i64 << 56), -1, (1i64 << 38) - 1]
        );
        assert_eq!(java(256, 255), vec![-1, -1, -1, i64::MAX]);
        assert_eq!(java(1, 0), Vec::<i64>::new());
    }

    #[test]
    fn and_empties_entry() {
        let mut a = AckSet::single_deleted(2, 0).unwrap();
        assert!(!a.is_empty());
        a.and_assign(&AckSet::single_deleted(2, 1).unwrap())
            .unwrap();
        assert!(a.is_empty());
        assert_eq!(a.cardinality(), 0);
    }

    #[test]
    fn overlap_rules() {
        let a = AckSet::single_deleted(8, 3).unwrap();
        assert!(a.overlaps(&AckSet::single_deleted(8, 3).unwrap()).unwrap());
        assert!(!a.overlaps(&AckSet::single_deleted(8, 4).unwrap()).unwrap());
        assert!(a.overlaps(&AckSet::single_deleted(9, 3).unwrap()).is_err());
    }

    #[test]
    fn bad_input() {
        assert!(AckSet::new(0).is_err());
        assert!(AckSet::new(-1).is_err());
        assert!(AckSet::single_deleted(10, 10).is_err());
        assert!(AckSet::from_words(&[1 << 10], 10).is_err());
        assert!(AckSet::from_words(&[0, 1], 64).is_err());
        assert_eq!(AckSet::from_words(&[], 64).unwrap().cardinality(), 0);
    }
}

/// Bulk operations over many ack sets stored as rows of `width` words
/// (row-major, e.g. a 2-D numpy array), so callers pay one call, not one per entry.
pub mod rows {
    use crate::error::{Error, Result};

    fn check(len: usize, width: usize, what: &str) -> Result<usize> {
        if width == 0 {
            return Err(Error::invalid(format!("{what}: row width must be >= 1")));
        }
        if len % width != 0 {
            return Err(Error::invalid(format!(
                "{what}: {len} words is not a whole number of rows of {width}"
            )));
        }
        Ok(len / width)
    }

    /// Row-wise AND of two equally shaped word arrays.
    pub fn and(a: &[i64], b: &[i64]) -> Result<Vec<i64>> {
        if a.len() != b.len() {
            return Err(Error::invalid(format!(
                "and: shapes differ ({} vs {} words)",
                a.len(),
                b.len()
            )));
        }
        Ok(a.iter().zip(b).map(|(x, y)| x & y).collect())
    }

    /// Records still present in each row.
    pub fn cardinality(words: &[i64], width: usize) -> Result<Vec<u32>> {
        check(words.len(), width, "cardinality")?;
        Ok(words
            .chunks_exact(width)
            .map(|r| r.iter().map(|w| w.count_ones()).sum())
            .collect())
    }

    /// Whether each row has every record deleted.
    pub fn is_empty(words: &[i64], width: usize) -> Result<Vec<bool>> {
        check(words.len(), width, "is_empty")?;
        Ok(words
            .chunks_exact(width)
            .map(|r| r.iter().all(|&w| w == 0))
            .collect())
    }

    /// Whether rows `a[i]` and `b[i]` delete a common index below `batch_sizes[i]`.
    pub fn overlaps(a: &[i64], b: &[i64], width: usize, batch_sizes: &[i64]) -> Result<Vec<bool>> {
        let n = check(a.len(), width, "overlaps")?;
        if a.len() != b.len() || batch_sizes.len() != n {
            return Err(Error::invalid(format!(
                "overlaps: shapes differ ({} words, {} words, {} batch sizes for {n} rows)",
                a.len(),
                b.len(),
                batch_sizes.len()
            )));
        }
        let mut out = Vec::with_capacity(n);
        for (i, (ra, rb)) in a.chunks_exact(width).zip(b.chunks_exact(width)).enumerate() {
            let size = batch_sizes[i];
            if size < 1 || size as u128 > (width as u128) * 64 {
                return Err(Error::invalid(format!(
                    "overlaps: batch size {size} of row {i} does not fit {width} words"
                )));
            }
            let hit = ra.iter().zip(rb).enumerate().any(|(w, (x, y))| {
                let lo = w as i64 * 64;
                let valid = if size - lo >= 64 {
                    u64::MAX
                } else if size <= lo {
                    0
                } else {
                    (1u64 << (size - lo)) - 1
                };
                !(*x as u64) & !(*y as u64) & valid != 0
            });
            out.push(hit);
        }
        Ok(out)
    }
}

/// Operations over ragged lists of ack-set words in Arrow `list<int64>`
/// layout — list `i` is `values[offsets[i]..offsets[i + 1]]` — as Spark
/// hands a column of ack sets to an Arrow UDF. Words follow Java
/// `BitSet.toLongArray()`: trailing all-zero words may be missing, so a
/// missing word reads as zero (every record in it deleted).
pub mod lists {
    use super::MAX_BATCH_SIZE;
    use crate::error::{Error, Result};

    /// The lists as slices of `values`; bad offsets are an error naming the list.
    pub fn split<'a>(offsets: &[i32], values: &'a [i64]) -> Result<Vec<&'a [i64]>> {
        let mut out = Vec::with_capacity(offsets.len().saturating_sub(1));
        for (i, w) in offsets.windows(2).enumerate() {
            let (a, b) = (w[0], w[1]);
            if a < 0 || b < a || b as usize > values.len() {
                return Err(Error::invalid(format!(
                    "ack-set list {i}: offsets [{a}, {b}) are out of order or beyond the {} \
                     words given",
                    values.len()
                )));
            }
            out.push(&values[a as usize..b as usize]);
        }
        Ok(out)
    }

    /// Records still present in each list.
    pub fn cardinality(offsets: &[i32], values: &[i64]) -> Result<Vec<u32>> {
        Ok(split(offsets, values)?
            .iter()
            .map(|l| l.iter().map(|w| w.count_ones()).sum())
            .collect())
    }

    /// Whether each list has every record deleted.
    pub fn is_empty(offsets: &[i32], values: &[i64]) -> Result<Vec<bool>> {
        Ok(split(offsets, values)?
            .iter()
            .map(|l| l.iter().all(|&w| w == 0))
            .collect())
    }

    /// Row-wise AND (deletions merged) as a new list column: `(offsets,
    /// values)`, trailing zero words dropped as `toLongArray()` does.
    pub fn and(
        a_offsets: &[i32],
        a_values: &[i64],
        b_offsets: &[i32],
        b_values: &[i64],
    ) -> Result<(Vec<i32>, Vec<i64>)> {
        let (a, b) = (split(a_offsets, a_values)?, split(b_offsets, b_values)?);
        if a.len() != b.len() {
            return Err(Error::invalid(format!(
                "and: {} lists vs {} lists",
                a.len(),
                b.len()
            )));
        }
        let mut offsets = Vec::with_capacity(a.len() + 1);
        let mut values = Vec::new();
        offsets.push(0);
        for (x, y) in a.iter().zip(&b) {
            let start = values.len();
            values.extend(x.iter().zip(y.iter()).map(|(p, q)| p & q));
            while values.len() > start && values.last() == Some(&0) {
                values.pop();
            }
            offsets.push(
                i32::try_from(values.len())
                    .map_err(|_| Error::invalid("and: result exceeds 2^31 words"))?,
            );
        }
        Ok((offsets, values))
    }

    /// Whether lists `a[i]` and `b[i]` both delete some index below
    /// `batch_sizes[i]` (the pending-ack conflict rule for batch indexes).
    pub fn overlaps(
        a_offsets: &[i32],
        a_values: &[i64],
        b_offsets: &[i32],
        b_values: &[i64],
        batch_sizes: &[i64],
    ) -> Result<Vec<bool>> {
        let (a, b) = (split(a_offsets, a_values)?, split(b_offsets, b_values)?);
        if a.len() != b.len() || a.len() != batch_sizes.len() {
            return Err(Error::invalid(format!(
                "overlaps: {} lists, {} lists and {} batch sizes",
                a.len(),
                b.len(),
                batch_sizes.len()
            )));
        }
        let mut out = Vec::with_capacity(a.len());
        for (i, ((x, y), &size)) in a.iter().zip(&b).zip(batch_sizes).enumerate() {
            if size < 1 || size > i64::from(MAX_BATCH_SIZE) {
                return Err(Error::invalid(format!(
                    "overlaps: batch size {size} of row {i} is not in 1..={MAX_BATCH_SIZE}"
                )));
            }
            let words = (size as usize).div_ceil(64);
            let hit = (0..words).any(|w| {
                let lo = w as i64 * 64;
                let valid = if size - lo >= 64 {
                    u64::MAX
                } else {
                    (1u64 << (size - lo)) - 1
                };
                let p = x.get(w).map_or(0, |&v| v as u64);
                let q = y.get(w).map_or(0, |&v| v as u64);
                !p & !q & valid != 0
            });
            out.push(hit);
        }
        Ok(out)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::ackset::AckSet;

        #[test]
        fn lists_match_single_sets() {
            let a = AckSet::single_deleted(70, 3).unwrap();
            let mut b = AckSet::single_deleted(70, 65).unwrap();
            let (aw, bw) = (a.to_words(), b.to_words());
            let mut values = aw.clone();
            values.extend(&bw);
            let offs = [0, aw.len() as i32, (aw.len() + bw.len()) as i32];
            assert_eq!(
                cardinality(&offs, &values).unwrap(),
                vec![a.cardinality(), b.cardinality()]
            );
            let (o, v) = and(&offs[..2], &aw, &[0, bw.len() as i32], &bw).unwrap();
            b.and_assign(&a).unwrap();
            assert_eq!(&v[o[0] as usize..o[1] as usize], b.to_words().as_slice());
            assert_eq!(
                overlaps(&offs[..2], &aw, &[0, aw.len() as i32], &aw, &[70]).unwrap(),
                vec![true]
            );
            assert_eq!(
                overlaps(&offs[..2], &aw, &[0, bw.len() as i32], &bw, &[70]).unwrap(),
                vec![false]
            );
        }

        #[test]
        fn missing_words_are_deleted_records() {
            // Batch of 2, all deleted: toLongArray() gives no word at all.
            assert_eq!(is_empty(&[0, 0], &[]).unwrap(), vec![true]);
            assert_eq!(cardinality(&[0, 0], &[]).unwrap(), vec![0]);
            assert_eq!(
                overlaps(&[0, 0], &[], &[0, 1], &[0b01], &[2]).unwrap(),
                vec![true]
            );
            // AND that clears the top word drops it.
            let (o, v) = and(&[0, 2], &[-1, 1], &[0, 2], &[-1, 2]).unwrap();
            assert_eq!((o, v), (vec![0, 1], vec![-1]));
        }

        #[test]
        fn bad_input_is_an_error() {
            assert!(split(&[0, 3], &[1, 2]).is_err());
            assert!(split(&[2, 1], &[1, 2]).is_err());
            assert!(split(&[-1, 0], &[]).is_err());
            assert!(overlaps(&[0, 0], &[], &[0, 0], &[], &[0]).is_err());
            assert!(overlaps(&[0, 0], &[], &[0, 0], &[], &[]).is_err());
            assert!(and(&[0, 0], &[], &[0, 0, 0], &[]).is_err());
        }
    }
}
