//! Counters and histograms of a writer, kept in atomics so that exporting
//! them (Prometheus, admin stats) never takes the writer's lock and no
//! foreign code runs per flush.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of `_bufferedwriter_batch_records` (SPEC §4.2).
pub const BATCH_RECORDS_BUCKETS: &[f64] = &[10.0, 50.0, 100.0, 200.0, 500.0, 1000.0];
/// Upper bounds of `_bufferedwriter_batch_size_bytes`.
pub const BATCH_SIZE_BYTES_BUCKETS: &[f64] = &[
    128.0, 512.0, 1024.0, 2048.0, 4096.0, 16384.0, 102400.0, 1232896.0,
];
/// Upper bounds of `_bufferedwriter_batch_oldest_record_delay_seconds`.
pub const OLDEST_RECORD_DELAY_BUCKETS: &[f64] = &[0.001, 0.005, 0.01];

/// Why a batch was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushTrigger {
    /// `max_records` reached.
    MaxRecords,
    /// `max_size` bytes reached.
    MaxSize,
    /// The first record waited `max_delay`.
    MaxDelay,
    /// A record of at least `max_size` arrived; it goes alone after the batch.
    LargeData,
    /// Not a threshold: an explicit `flush()`, or batching switched off.
    Forced,
}

/// A fixed-bucket histogram of non-negative values.
#[derive(Debug)]
pub(crate) struct Histogram {
    bounds: &'static [f64],
    /// Per-bucket counts (not cumulative); the last is `+Inf`.
    counts: Vec<AtomicU64>,
    /// Sum of observations, as `f64` bits.
    sum_bits: AtomicU64,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub(crate) fn observe(&self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i].fetch_add(1, Relaxed);
        // Observations happen under the writer's lock, so this CAS loop
        // never spins in practice; it keeps the sum exact regardless.
        let _ = self.sum_bits.fetch_update(Relaxed, Relaxed, |b| {
            Some((f64::from_bits(b) + v).to_bits())
        });
    }

    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        HistogramSnapshot {
            bounds: self.bounds,
            count: counts.iter().sum(),
            counts,
            sum: f64::from_bits(self.sum_bits.load(Relaxed)),
        }
    }
}

/// A point-in-time copy of a histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Finite upper bounds (inclusive, Prometheus `le`).
    pub bounds: &'static [f64],
    /// Observations per bucket, NOT cumulative; `bounds.len() + 1` values,
    /// the last one for `+Inf`.
    pub counts: Vec<u64>,
    /// Sum of all observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl HistogramSnapshot {
    /// Cumulative counts per bound, ending with `+Inf` (= `count`).
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts
            .iter()
            .scan(0u64, |acc, c| {
                *acc += c;
                Some(*acc)
            })
            .collect()
    }
}

/// Live counters of one writer.
#[derive(Debug)]
pub(crate) struct Metrics {
    pub flush_max_records: AtomicU64,
    pub flush_max_size: AtomicU64,
    pub flush_max_delay: AtomicU64,
    pub flush_large_data: AtomicU64,
    pub flush_forced: AtomicU64,
    pub entries: AtomicU64,
    pub batched_entries: AtomicU64,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub failed_entries: AtomicU64,
    pub failed_records: AtomicU64,
    pub closed_records: AtomicU64,
    pub batch_records: Histogram,
    pub batch_size_bytes: Histogram,
    pub oldest_record_delay: Histogram,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let z = || AtomicU64::new(0);
        Self {
            flush_max_records: z(),
            flush_max_size: z(),
            flush_max_delay: z(),
            flush_large_data: z(),
            flush_forced: z(),
            entries: z(),
            batched_entries: z(),
            records: z(),
            bytes: z(),
            failed_entries: z(),
            failed_records: z(),
            closed_records: z(),
            batch_records: Histogram::new(BATCH_RECORDS_BUCKETS),
            batch_size_bytes: Histogram::new(BATCH_SIZE_BYTES_BUCKETS),
            oldest_record_delay: Histogram::new(OLDEST_RECORD_DELAY_BUCKETS),
        }
    }

    pub(crate) fn count_trigger(&self, t: FlushTrigger) {
        let c = match t {
            FlushTrigger::MaxRecords => &self.flush_max_records,
            FlushTrigger::MaxSize => &self.flush_max_size,
            FlushTrigger::MaxDelay => &self.flush_max_delay,
            FlushTrigger::LargeData => &self.flush_large_data,
            FlushTrigger::Forced => &self.flush_forced,
        };
        c.fetch_add(1, Relaxed);
    }

    /// One batched entry handed to storage.
    pub(crate) fn observe_batch(&self, records: u32, entry_len: usize, oldest: Duration) {
        self.batch_records.observe(f64::from(records));
        self.batch_size_bytes.observe(entry_len as f64);
        self.oldest_record_delay.observe(oldest.as_secs_f64());
    }
}

/// A snapshot of a writer's counters (what `stats()` and metrics export).
#[derive(Debug, Clone, PartialEq)]
pub struct WriterStats {
    /// The writer's name (label of its metrics).
    pub name: String,
    /// Whether batching is currently on.
    pub batch_enabled: bool,
    /// Batches written because `max_records` was reached.
    pub flush_max_records: u64,
    /// Batches written because `max_size` was reached.
    pub flush_max_size: u64,
    /// Batches written because the first record waited `max_delay`.
    pub flush_max_delay: u64,
    /// Records of at least `max_size` (each flushed the batch, then went alone).
    pub flush_large_data: u64,
    /// Batches written by `flush()` or by switching batching off.
    pub flush_forced: u64,
    /// Entries durably written (batched and unbatched).
    pub entries: u64,
    /// Of those, batched entries.
    pub batched_entries: u64,
    /// Records durably written.
    pub records: u64,
    /// Entry bytes durably written (framing included).
    pub bytes: u64,
    /// Entries the storage failed.
    pub failed_entries: u64,
    /// Records in failed entries.
    pub failed_records: u64,
    /// Records failed by `close()` before they were written.
    pub closed_records: u64,
    /// Records waiting in the current batch.
    pub pending_records: u64,
    /// Entries handed to storage and not yet completed.
    pub in_flight_entries: u64,
    /// Records per batched entry.
    pub batch_records: HistogramSnapshot,
    /// Bytes per batched entry.
    pub batch_size_bytes: HistogramSnapshot,
    /// Seconds the oldest record of a batch waited before the batch was written.
    pub oldest_record_delay: HistogramSnapshot,
}

impl Metrics {
    pub(crate) fn snapshot(
        &self,
        name: &str,
        batch_enabled: bool,
        pending: u64,
        in_flight: u64,
    ) -> WriterStats {
        WriterStats {
            name: name.to_owned(),
            batch_enabled,
            flush_max_records: self.flush_max_records.load(Relaxed),
            flush_max_size: self.flush_max_size.load(Relaxed),
            flush_max_delay: self.flush_max_delay.load(Relaxed),
            flush_large_data: self.flush_large_data.load(Relaxed),
            flush_forced: self.flush_forced.load(Relaxed),
            entries: self.entries.load(Relaxed),
            batched_entries: self.batched_entries.load(Relaxed),
            records: self.records.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            failed_entries: self.failed_entries.load(Relaxed),
            failed_records: self.failed_records.load(Relaxed),
            closed_records: self.closed_records.load(Relaxed),
            pending_records: pending,
            in_flight_entries: in_flight,
            batch_records: self.batch_records.snapshot(),
            batch_size_bytes: self.batch_size_bytes.snapshot(),
            oldest_record_delay: self.oldest_record_delay.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_inclusive_upper_bounds() {
        let h = Histogram::new(BATCH_RECORDS_BUCKETS);
        for v in [1.0, 10.0, 11.0, 1000.0, 1001.0] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.counts, vec![2, 1, 0, 0, 0, 1, 1]);
        assert_eq!(s.cumulative(), vec![2, 3, 3, 3, 3, 4, 5]);
        assert_eq!(s.count, 5);
        assert_eq!(s.sum, 2023.0);
    }
}
