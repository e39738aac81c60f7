//! Thresholds of a [`BufferedWriter`](super::BufferedWriter).

use crate::ackset::MAX_BATCH_SIZE;
use crate::error::{Error, Result};
use std::time::Duration;

/// Default `max_records` (Pulsar's `transactionLogBatchedWriteMaxRecords`).
pub const DEFAULT_MAX_RECORDS: u32 = 512;
/// Default `max_size` in bytes (4 MiB).
pub const DEFAULT_MAX_SIZE: usize = 4 << 20;
/// Default `max_delay` (1 ms).
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(1);

/// When a batch is written: whichever threshold is reached first.
///
/// The writer accepts any `max_records >= 1` (1 means every record goes
/// alone, unbatched) and any `max_size >= 1`; the stricter broker limits of
/// PIP-160 (10 records, 128 KiB, 1 ms) belong to the broker configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterConfig {
    /// Records per batch before it is written.
    pub max_records: u32,
    /// Record bytes per batch before it is written; a single record of at
    /// least this size is written alone, unbatched.
    pub max_size: usize,
    /// Longest time the first record of a batch waits. Zero writes the
    /// batch at the end of every `write`/`write_many` call.
    pub max_delay: Duration,
    /// Whether records are batched at all (switchable at runtime).
    pub batch_enabled: bool,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            max_records: DEFAULT_MAX_RECORDS,
            max_size: DEFAULT_MAX_SIZE,
            max_delay: DEFAULT_MAX_DELAY,
            batch_enabled: true,
        }
    }
}

impl WriterConfig {
    /// Checks the thresholds; the error names the offending key and value.
    pub fn validate(&self) -> Result<()> {
        if self.max_records < 1 || self.max_records > MAX_BATCH_SIZE {
            return Err(Error::Config {
                key: "max_records".into(),
                value: self.max_records.to_string(),
                reason: format!("must be in 1..={MAX_BATCH_SIZE}"),
            });
        }
        // A batch may grow to almost 2 x max_size before it flushes; it must
        // still fit one ledger entry.
        let limit = crate::ledger::MAX_ENTRY_SIZE / 2;
        if self.max_size < 1 || self.max_size > limit {
            return Err(Error::Config {
                key: "max_size".into(),
                value: self.max_size.to_string(),
                reason: format!("must be in 1..={limit} bytes"),
            });
        }
        // The same bound as `delay_from_millis`: `Instant + max_delay` must not overflow.
        if self.max_delay > Duration::from_secs(86_400) {
            return Err(Error::Config {
                key: "max_delay_ms".into(),
                value: self.max_delay.as_millis().to_string(),
                reason: "must be at most 86400000 ms (a day)".into(),
            });
        }
        Ok(())
    }

    /// Builds a config from a delay in milliseconds as users give it
    /// (fractions allowed), rejecting negative, NaN or absurd values.
    pub fn delay_from_millis(ms: f64) -> Result<Duration> {
        // A day is far beyond any sensible batching delay; it also keeps
        // `Instant + delay` from overflowing.
        const MAX_MS: f64 = 86_400_000.0;
        if !(0.0..=MAX_MS).contains(&ms) {
            return Err(Error::Config {
                key: "max_delay_ms".into(),
                value: ms.to_string(),
                reason: format!("must be a number of milliseconds in 0..={MAX_MS}"),
            });
        }
        Ok(Duration::from_secs_f64(ms / 1000.0))
    }

    /// True when records are grouped: enabled and more than one per batch.
    pub fn batching(&self) -> bool {
        self.batch_enabled && self.max_records > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_key_and_value() {
        assert!(WriterConfig::default().validate().is_ok());
        let bad = WriterConfig {
            max_records: 0,
            ..Default::default()
        };
        match bad.validate() {
            Err(Error::Config { key, value, .. }) => {
                assert_eq!((key.as_str(), value.as_str()), ("max_records", "0"))
            }
            other => panic!("{other:?}"),
        }
        let bad = WriterConfig {
            max_size: 0,
            ..Default::default()
        };
        assert!(matches!(bad.validate(), Err(Error::Config { key, .. }) if key == "max_size"));
        assert!(WriterConfig::delay_from_millis(-1.0).is_err());
        assert!(WriterConfig::delay_from_millis(f64::NAN).is_err());
        assert_eq!(
            WriterConfig::delay_from_millis(1.5).unwrap(),
            Duration::from_micros(1500)
        );
        let one = WriterConfig {
            max_records: 1,
            ..Default::default()
        };
        assert!(one.validate().is_ok() && !one.batching());
    }
}
