//! One ledger's files: `<id>.log` (entry data) and `<id>.idx` (where each
//! entry ends). Both are written behind the journal by the flusher and made
//! durable by checkpoints; reads verify every checksum.
//!
//! ```text
//! .log: header, 32 bytes: magic "TXSLEDG\0" | u32 version=2 | u32 flags=0
//!                         | u64 ledger_id | u32 crc32c(bytes 0..24) | u32 0
//!       records:          [u32 len][u32 crc32c(len LE ++ payload)][payload]
//! .idx: header, 32 bytes: magic "TXSLIDX\0" | u32 version=1 | same as above
//!       slots:            u64 LE per entry e, at 32 + 8e:
//!                         bits 0..48  = .log offset just past entry e's record
//!                         bits 48..64 = crc32c(ledger_id LE ++ e LE ++ end LE) & 0xffff
//! ```
//!
//! Entry `e` spans `.log` bytes from the end of entry `e-1` (or 32) to its
//! slot's end: one read of `n + 1` slots and one read of the data serve a
//! run of `n` entries. A slot's check bits and the record's own checksum
//! catch a stale or flipped slot; nothing unverified is ever returned.

use super::fs::FsFile;
use super::journal::{body_crc, le_u32, le_u64};
use super::options::MAX_ENTRY_SIZE;
use crate::error::{Error, Result};
use crate::position::Position;
use std::io;
use std::path::{Path, PathBuf};

/// First bytes of every ledger data file.
pub const LOG_MAGIC: [u8; 8] = *b"TXSLEDG\0";
/// Version of the ledger data file format.
pub const LOG_VERSION: u32 = 2;
/// First bytes of every ledger index file.
pub const IDX_MAGIC: [u8; 8] = *b"TXSLIDX\0";
/// Version of the ledger index file format.
pub const IDX_VERSION: u32 = 1;
/// Size of both files' headers.
pub const HEADER_LEN: u64 = 32;
/// `[u32 len][u32 crc32c]` in front of every payload.
pub const RECORD_HEADER_LEN: usize = 8;
/// Bytes per index slot.
pub const SLOT_LEN: u64 = 8;
/// Largest `.log` size a slot can address.
pub const MAX_LOG_BYTES: u64 = (1 << 48) - 1;

/// Path of ledger `id`'s data file: `<prefix>@<id>.log`, `prefix` being
/// `<data>/ledgers/<escaped managed-ledger name>` (all ledger files of a
/// data directory share one directory, so one directory sync covers every
/// file a checkpoint created).
pub fn log_path(prefix: &Path, id: u64) -> PathBuf {
    with_suffix(prefix, id, "log")
}

/// Path of ledger `id`'s index file: `<prefix>@<id>.idx`.
pub fn idx_path(prefix: &Path, id: u64) -> PathBuf {
    with_suffix(prefix, id, "idx")
}

fn with_suffix(prefix: &Path, id: u64, ext: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!("@{id}.{ext}"));
    PathBuf::from(s)
}

/// Splits a ledger file name into (escaped managed-ledger name, ledger id,
/// is index).
pub fn parse_file_name(name: &str) -> Option<(&str, u64, bool)> {
    let (stem, idx) = match name.strip_suffix(".log") {
        Some(s) => (s, false),
        None => (name.strip_suffix(".idx")?, true),
    };
    let (ml, id) = stem.rsplit_once('@')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((ml, id.parse().ok()?, idx))
}

/// The 32-byte header of a `.log` (`idx = false`) or `.idx` file.
pub fn encode_header(ledger_id: u64, idx: bool) -> [u8; HEADER_LEN as usize] {
    let (magic, version) = if idx {
        (IDX_MAGIC, IDX_VERSION)
    } else {
        (LOG_MAGIC, LOG_VERSION)
    };
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(&magic);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[16..24].copy_from_slice(&ledger_id.to_le_bytes());
    let crc = crc32c::crc32c(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

fn check16(ledger_id: u64, entry: u64, end: u64) -> u64 {
    let mut b = [0u8; 24];
    b[..8].copy_from_slice(&ledger_id.to_le_bytes());
    b[8..16].copy_from_slice(&entry.to_le_bytes());
    b[16..].copy_from_slice(&end.to_le_bytes());
    u64::from(crc32c::crc32c(&b) & 0xffff)
}

/// Entry `entry`'s index slot for a record ending at `end`.
pub fn encode_slot(ledger_id: u64, entry: u64, end: u64) -> [u8; 8] {
    (end | (check16(ledger_id, entry, end) << 48)).to_le_bytes()
}

fn decode_slot(ledger_id: u64, entry: u64, b: &[u8]) -> Option<u64> {
    let v = le_u64(b);
    let end = v & MAX_LOG_BYTES;
    (v >> 48 == check16(ledger_id, entry, end)).then_some(end)
}

/// A `CorruptLedger` error about a ledger file.
pub fn corrupt(path: &Path, id: u64, entry: u64, offset: u64, reason: impl Into<String>) -> Error {
    Error::CorruptLedger {
        path: path.display().to_string(),
        position: Position::new(id, entry),
        offset,
        reason: reason.into(),
    }
}

fn read_err(path: &Path, e: &io::Error) -> Error {
    Error::io(format!("reading ledger file {}", path.display()), e)
}

/// Validates the header of ledger `id`'s `.log` or `.idx` file.
pub fn check_header(file: &dyn FsFile, path: &Path, id: u64, idx: bool) -> Result<()> {
    let mut h = [0u8; HEADER_LEN as usize];
    file.read_exact_at(&mut h, 0).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            corrupt(path, id, 0, 0, "file shorter than its header")
        } else {
            read_err(path, &e)
        }
    })?;
    let want = encode_header(id, idx);
    if h[..8] != want[..8] {
        return Err(corrupt(path, id, 0, 0, "bad magic"));
    }
    if crc32c::crc32c(&h[..24]) != le_u32(&h[24..]) {
        return Err(corrupt(path, id, 0, 0, "header checksum mismatch"));
    }
    let version = le_u32(&h[8..]);
    if h[8..12] != want[8..12] {
        return Err(corrupt(
            path,
            id,
            0,
            0,
            format!(
                "unsupported ledger file version {version} (this build reads {})",
                le_u32(&want[8..])
            ),
        ));
    }
    let found = le_u64(&h[16..]);
    if found != id {
        return Err(corrupt(
            path,
            id,
            0,
            0,
            format!("header names ledger {found}"),
        ));
    }
    Ok(())
}

/// The two open files of one ledger.
#[derive(Debug)]
pub struct LedgerFiles<'a> {
    /// Ledger id.
    pub id: u64,
    /// `.log` and its path.
    pub log: &'a dyn FsFile,
    /// Path of the `.log`.
    pub log_path: &'a Path,
    /// `.idx`.
    pub idx: &'a dyn FsFile,
    /// Path of the `.idx`.
    pub idx_path: &'a Path,
}

impl LedgerFiles<'_> {
    /// Where the record of entry `e` ends (from its slot).
    fn slots(&self, first: u64, n: u64) -> Result<Vec<u64>> {
        let mut buf = vec![0u8; (n * SLOT_LEN) as usize];
        self.idx
            .read_exact_at(&mut buf, HEADER_LEN + first * SLOT_LEN)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    corrupt(
                        self.idx_path,
                        self.id,
                        first,
                        HEADER_LEN + first * SLOT_LEN,
                        "index file is shorter than its entry count",
                    )
                } else {
                    read_err(self.idx_path, &e)
                }
            })?;
        (0..n)
            .map(|i| {
                let e = first + i;
                let off = (i * SLOT_LEN) as usize;
                decode_slot(self.id, e, &buf[off..off + 8]).ok_or_else(|| {
                    corrupt(
                        self.idx_path,
                        self.id,
                        e,
                        HEADER_LEN + e * SLOT_LEN,
                        "index slot check mismatch",
                    )
                })
            })
            .collect()
    }

    /// Reads entries `[first, first + n)` (all in the files), verifying
    /// every slot and checksum.
    pub fn read(&self, first: u64, n: u64) -> Result<Vec<Vec<u8>>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let (start, ends) = if first == 0 {
            (HEADER_LEN, self.slots(0, n)?)
        } else {
            let mut s = self.slots(first - 1, n + 1)?;
            let start = s.remove(0);
            (start, s)
        };
        let end = *ends.last().unwrap_or(&start);
        if end < start || end - start > (n as u128 * (MAX_ENTRY_SIZE as u128 + 8)) as u64 {
            return Err(corrupt(
                self.idx_path,
                self.id,
                first,
                HEADER_LEN + first * SLOT_LEN,
                format!("index slots give an impossible range {start}..{end}"),
            ));
        }
        let mut buf = vec![0u8; (end - start) as usize];
        self.log.read_exact_at(&mut buf, start).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                corrupt(
                    self.log_path,
                    self.id,
                    first,
                    start,
                    "data file is shorter than its index",
                )
            } else {
                read_err(self.log_path, &e)
            }
        })?;
        let mut out = Vec::with_capacity(n as usize);
        let mut at = 0usize;
        for (i, &rec_end) in ends.iter().enumerate() {
            let e = first + i as u64;
            let off = start + at as u64;
            let bad = |why: &str| corrupt(self.log_path, self.id, e, off, why);
            if rec_end < off + RECORD_HEADER_LEN as u64 {
                return Err(bad("index slot points before the record"));
            }
            if rec_end > end {
                // Slots must not decrease: this one ends past the range read.
                return Err(bad("index slot points past the last record"));
            }
            let len = (rec_end - off) as usize - RECORD_HEADER_LEN;
            let h = &buf[at..at + RECORD_HEADER_LEN];
            let payload = &buf[at + RECORD_HEADER_LEN..at + RECORD_HEADER_LEN + len];
            if le_u32(h) as usize != len {
                return Err(bad("record length disagrees with the index"));
            }
            if le_u32(&h[4..]) != body_crc(payload) {
                return Err(bad("record checksum mismatch on read"));
            }
            out.push(payload.to_vec());
            at += RECORD_HEADER_LEN + len;
        }
        Ok(out)
    }
}

/// One record for [`append`]: its payload, or `None` when the record is
/// already in place in the `.log` (a large entry the journal writer wrote
/// there directly), with its length and checksum ([`body_crc`]).
#[derive(Debug, Clone, Copy)]
pub struct NewRecord<'a> {
    /// The payload to write, or `None` if already written.
    pub payload: Option<&'a [u8]>,
    /// Payload length.
    pub len: u32,
    /// Payload checksum.
    pub crc: u32,
}

/// Appends records to a ledger's files: data from `log_end` on (records in
/// place are skipped over), slots for entries `first_entry..`. Returns the
/// new `.log` end.
pub fn append(
    files: &LedgerFiles<'_>,
    first_entry: u64,
    log_end: u64,
    records: &[NewRecord<'_>],
) -> Result<u64> {
    let mut heads = Vec::with_capacity(records.len() * RECORD_HEADER_LEN);
    let mut slots = Vec::with_capacity(records.len() * SLOT_LEN as usize);
    let mut end = log_end;
    for (i, r) in records.iter().enumerate() {
        heads.extend_from_slice(&r.len.to_le_bytes());
        heads.extend_from_slice(&r.crc.to_le_bytes());
        end += (RECORD_HEADER_LEN + r.len as usize) as u64;
        if end > MAX_LOG_BYTES {
            return Err(Error::invalid(format!(
                "ledger {} would exceed {MAX_LOG_BYTES} bytes",
                files.id
            )));
        }
        slots.extend_from_slice(&encode_slot(files.id, first_entry + i as u64, end));
    }
    // One write per run of records to write (records in place split runs).
    let mut at = log_end;
    let mut i = 0;
    while i < records.len() {
        let size = |r: &NewRecord<'_>| (RECORD_HEADER_LEN + r.len as usize) as u64;
        if records[i].payload.is_none() {
            at += size(&records[i]);
            i += 1;
            continue;
        }
        let run_start = at;
        let mut bufs: Vec<&[u8]> = Vec::new();
        while i < records.len() {
            let Some(p) = records[i].payload else { break };
            bufs.push(&heads[i * RECORD_HEADER_LEN..(i + 1) * RECORD_HEADER_LEN]);
            bufs.push(p);
            at += size(&records[i]);
            i += 1;
        }
        files
            .log
            .write_all_vectored_at(&bufs, run_start)
            .map_err(|e| Error::io(format!("writing {}", files.log_path.display()), &e))?;
    }
    files
        .idx
        .write_all_at(&slots, HEADER_LEN + first_entry * SLOT_LEN)
        .map_err(|e| Error::io(format!("writing {}", files.idx_path.display()), &e))?;
    Ok(end)
}
