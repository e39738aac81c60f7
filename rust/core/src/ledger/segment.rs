//! One ledger file: header, record framing, recovery scan, reads.
//!
//! See the module documentation of [`super`] for the byte layout.

use super::crc_range::RangeCrc;
use super::options::MAX_ENTRY_SIZE;
use crate::error::{Error, Result};
use crate::position::Position;
use parking_lot::RwLock;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// First bytes of every ledger file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"TXSLEDG\0";
/// Version of the ledger file format.
pub const SEGMENT_VERSION: u32 = 1;
/// Size of the file header; the first record starts here.
pub const HEADER_LEN: u64 = 32;
/// `[u32 len][u32 crc32c]` in front of every payload.
pub const RECORD_HEADER_LEN: usize = 8;

/// Scan reads the file in chunks of this size.
const SCAN_CHUNK: usize = 1 << 20;

/// crc32c over the four little-endian length bytes followed by the payload.
/// Covering the length means a zero-filled (preallocated) region, length 0
/// and crc 0, never validates as an empty entry.
pub fn record_crc(payload: &[u8]) -> u32 {
    let len = (payload.len() as u32).to_le_bytes();
    crc32c::crc32c_append(crc32c::crc32c(&len), payload)
}

/// Appends one framed record to `buf`.
pub fn encode_record(buf: &mut Vec<u8>, payload: &[u8]) {
    encode_record_header(buf, payload);
    buf.extend_from_slice(payload);
}

/// Appends the header of `payload`'s record to `buf` (the payload is
/// written separately).
pub fn encode_record_header(buf: &mut Vec<u8>, payload: &[u8]) {
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&record_crc(payload).to_le_bytes());
}

/// The 32-byte file header: magic, version, flags (0), ledger id, crc32c of
/// the first 24 bytes, 4 reserved zero bytes.
pub fn encode_header(ledger_id: u64) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&ledger_id.to_le_bytes());
    let crc = crc32c::crc32c(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Path of ledger `id` in a managed ledger's directory.
pub fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id}.log"))
}

/// Suffix of the synced-offset hint of the open ledger (`<id>.synced`).
pub const SYNCED_SUFFIX: &str = ".synced";

/// Path of ledger `id`'s synced-offset hint.
pub fn synced_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id}{SYNCED_SUFFIX}"))
}

/// The synced-offset hint: `[u64 end][u32 crc32c(end bytes)][u32 0]`.
pub fn encode_synced(end: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&end.to_le_bytes());
    let crc = crc32c::crc32c(&b[..8]);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Reads ledger `id`'s synced-offset hint: `Ok(None)` if there is no hint
/// file (a sealed ledger, or one written before hints existed), `Ok(Some(None))`
/// if it is unreadable right now (a torn read: make no progress).
pub fn read_synced(dir: &Path, id: u64) -> Result<Option<Option<u64>>> {
    let path = synced_path(dir, id);
    let b = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), &e)),
    };
    if b.len() < 12 || crc32c::crc32c(&b[..8]) != le_u32(&b[8..]) {
        return Ok(Some(None));
    }
    Ok(Some(Some(le_u64(&b[..8]))))
}

/// Where each published (durable, readable) entry lives in the file.
#[derive(Debug, Default)]
pub struct SegmentIndex {
    /// File offset of each entry's record header.
    pub offsets: Vec<u64>,
    /// Payload length of each entry.
    pub lens: Vec<u32>,
    /// File offset just past the last published record.
    pub end: u64,
}

impl SegmentIndex {
    /// Number of published entries.
    pub fn count(&self) -> u64 {
        self.offsets.len() as u64
    }
}

/// An open ledger file and the index of its published entries.
#[derive(Debug)]
pub struct Segment {
    /// Ledger id.
    pub id: u64,
    /// File path, for errors.
    pub path: PathBuf,
    /// Read handle (read-write for the writer's active segment).
    pub file: File,
    /// Published entries.
    pub index: RwLock<SegmentIndex>,
}

/// How a scan treats an invalid record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    /// A sealed ledger: exactly `n` entries, nothing but zeros after them.
    Sealed(u64),
    /// The writer's crashed active ledger: a torn tail is cut off.
    Recover,
    /// Another process's live ledger: stop at the first incomplete record
    /// and never read past `synced`, the durable end the writer published
    /// (`None`: no hint, read every complete record).
    Live {
        /// Offset up to which the writer has synced the file.
        synced: Option<u64>,
    },
}

/// Outcome of scanning a file from some offset.
#[derive(Debug, Default)]
pub struct ScanResult {
    /// Entries found: (record offset, payload length).
    pub entries: Vec<(u64, u32)>,
    /// Offset just past the last valid record.
    pub end: u64,
    /// Why the scan stopped before the end of the file, if it did on
    /// non-zero bytes (a torn tail in `Recover` mode).
    pub torn: Option<String>,
}

/// Sequential chunked reader over a file, so a scan never holds a whole
/// ledger in memory.
struct Chunks<'a> {
    file: &'a File,
    file_len: u64,
    buf: Vec<u8>,
    start: u64,
}

impl<'a> Chunks<'a> {
    fn new(file: &'a File, file_len: u64) -> Self {
        Self {
            file,
            file_len,
            buf: Vec::new(),
            start: 0,
        }
    }

    /// Bytes `[off, off+len)`, or `None` if the file is shorter.
    fn get(&mut self, off: u64, len: usize) -> io::Result<Option<&[u8]>> {
        let Some(want_end) = off.checked_add(len as u64) else {
            return Ok(None);
        };
        if want_end > self.file_len {
            return Ok(None);
        }
        let have_end = self.start + self.buf.len() as u64;
        if off < self.start || want_end > have_end {
            let n = (len.max(SCAN_CHUNK) as u64).min(self.file_len - off) as usize;
            self.buf.resize(n, 0);
            // Another process's writer may shrink the file meanwhile (sealing
            // cuts the preallocated tail): read what is there.
            let mut got = 0;
            while got < n {
                match self.file.read_at(&mut self.buf[got..], off + got as u64) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.buf.truncate(got);
            self.start = off;
            if got < n {
                self.file_len = off + got as u64;
                if want_end > self.file_len {
                    return Ok(None);
                }
            }
        }
        let s = (off - self.start) as usize;
        Ok(Some(&self.buf[s..s + len]))
    }

    /// True if every byte from `off` to the end of the file is zero.
    fn zeros_from(&mut self, mut off: u64) -> io::Result<bool> {
        while off < self.file_len {
            let n = (SCAN_CHUNK as u64).min(self.file_len - off) as usize;
            match self.get(off, n)? {
                Some(b) if b.iter().all(|&x| x == 0) => off += n as u64,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// Checks the record at `off`; returns its payload length if it is valid.
fn valid_record_at(chunks: &mut Chunks<'_>, off: u64) -> io::Result<Option<u32>> {
    let Some(h) = chunks.get(off, RECORD_HEADER_LEN)? else {
        return Ok(None);
    };
    let len = le_u32(h);
    let crc = le_u32(&h[4..]);
    if len == 0 && crc == 0 {
        return Ok(None);
    }
    if len as usize > MAX_ENTRY_SIZE {
        return Ok(None);
    }
    match chunks.get(off + RECORD_HEADER_LEN as u64, len as usize)? {
        Some(p) if record_crc(p) == crc => Ok(Some(len)),
        _ => Ok(None),
    }
}

/// Offset of the first non-zero byte at or after `off`, if any.
fn next_nonzero(chunks: &mut Chunks<'_>, mut off: u64) -> io::Result<Option<u64>> {
    while off < chunks.file_len {
        let n = (SCAN_CHUNK as u64).min(chunks.file_len - off) as usize;
        let Some(b) = chunks.get(off, n)? else {
            return Ok(None);
        };
        if let Some(i) = b.iter().position(|&x| x != 0) {
            return Ok(Some(off + i as u64));
        }
        off += n as u64;
    }
    Ok(None)
}

/// Where the record at `off` claims the next one starts, if its length is
/// plausible.
fn claimed_next(chunks: &mut Chunks<'_>, off: u64) -> io::Result<Option<u64>> {
    let Some(h) = chunks.get(off, RECORD_HEADER_LEN)? else {
        return Ok(None);
    };
    let len = le_u32(h) as usize;
    Ok((len <= MAX_ENTRY_SIZE).then(|| off + (RECORD_HEADER_LEN + len) as u64))
}

/// Looks for any valid record starting after `from` (a bad record): its
/// presence means the damage is not a tail but in the middle.
///
/// Cost bound: one sequential pass reads the rest of the file and keeps
/// crc checkpoints every [`crc_range::STEP`](super::crc_range::STEP) bytes
/// (4 bytes of memory per 256 bytes). A second pass visits every offset
/// once, skipping zero runs in bulk; only a non-zero header with a length
/// of at most [`MAX_ENTRY_SIZE`] whose record fits in the file is a
/// candidate, and a candidate costs two reads of < 256 bytes, < 512 bytes
/// of crc and two 32-bit carry-less shifts — never a read of its payload.
/// So the search is O(rest of file + candidates), candidates <= non-zero
/// bytes after `from`, whatever the lengths the garbage claims.
fn valid_record_after(chunks: &mut Chunks<'_>, file: &File, from: u64) -> io::Result<Option<u64>> {
    let base = from + 1;
    let mut crcs = RangeCrc::new(base);
    let mut off = base;
    while off < chunks.file_len {
        let n = (SCAN_CHUNK as u64).min(chunks.file_len - off) as usize;
        let Some(b) = chunks.get(off, n)? else { break };
        crcs.feed(b);
        off += n as u64;
    }
    let end = crcs.end();
    let mut c = base;
    while c + RECORD_HEADER_LEN as u64 <= end {
        let Some(h) = chunks.get(c, RECORD_HEADER_LEN)? else {
            break;
        };
        if h.iter().all(|&b| b == 0) {
            // A header needs a non-zero byte: the earliest one that can
            // hold the next non-zero byte starts 7 bytes before it.
            match next_nonzero(chunks, c + RECORD_HEADER_LEN as u64)? {
                Some(q) => {
                    c = (q - (RECORD_HEADER_LEN as u64 - 1)).max(c + 1);
                    continue;
                }
                None => break,
            }
        }
        let mut len_bytes = [0u8; 4];
        len_bytes.copy_from_slice(&h[..4]);
        let len = u32::from_le_bytes(len_bytes);
        let crc = le_u32(&h[4..]);
        let payload = c + RECORD_HEADER_LEN as u64;
        if (len as usize) <= MAX_ENTRY_SIZE && payload + u64::from(len) <= end {
            if let Some(pc) = crcs.range(file, payload, payload + u64::from(len))? {
                let whole =
                    super::crc_range::combine(crc32c::crc32c(&len_bytes), pc, u64::from(len));
                if whole == crc {
                    return Ok(Some(c));
                }
            }
        }
        c += 1;
    }
    Ok(None)
}

fn read_err(path: &Path, e: &io::Error) -> Error {
    Error::io(format!("reading ledger file {}", path.display()), e)
}

fn corrupt(path: &Path, id: u64, entry: u64, offset: u64, reason: impl Into<String>) -> Error {
    Error::CorruptLedger {
        path: path.display().to_string(),
        position: Position::new(id, entry),
        offset,
        reason: reason.into(),
    }
}

/// Validates the file header of ledger `id`.
pub fn check_header(file: &File, path: &Path, id: u64) -> Result<()> {
    let mut h = [0u8; HEADER_LEN as usize];
    file.read_exact_at(&mut h, 0).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            corrupt(path, id, 0, 0, "file shorter than its header")
        } else {
            read_err(path, &e)
        }
    })?;
    if h[..8] != SEGMENT_MAGIC {
        return Err(corrupt(path, id, 0, 0, "bad magic"));
    }
    if crc32c::crc32c(&h[..24]) != le_u32(&h[24..]) {
        return Err(corrupt(path, id, 0, 0, "header checksum mismatch"));
    }
    let version = le_u32(&h[8..]);
    if version != SEGMENT_VERSION {
        return Err(corrupt(
            path,
            id,
            0,
            0,
            format!("unsupported ledger file version {version}"),
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

/// Scans records from `start` (a record boundary; `first_entry` is the id of
/// the entry there). Corruption followed by a valid record is a
/// `CorruptLedger` error naming the first bad entry, in every mode.
pub fn scan(
    file: &File,
    path: &Path,
    id: u64,
    start: u64,
    first_entry: u64,
    mode: ScanMode,
) -> Result<ScanResult> {
    let mut file_len = file.metadata().map_err(|e| read_err(path, &e))?.len();
    if let ScanMode::Live { synced: Some(s) } = mode {
        // Bytes past the writer's synced offset may still be rewritten.
        file_len = file_len.min(s);
    }
    let mut chunks = Chunks::new(file, file_len);
    let mut out = ScanResult {
        end: start,
        ..ScanResult::default()
    };
    let mut off = start;
    let rerr = |e: io::Error| read_err(path, &e);
    loop {
        let entry = first_entry + out.entries.len() as u64;
        if let ScanMode::Sealed(n) = mode {
            if entry == n {
                if !chunks.zeros_from(off).map_err(rerr)? {
                    return Err(corrupt(path, id, entry, off, "data after the sealed end"));
                }
                return Ok(out);
            }
        }
        if let Some(len) = valid_record_at(&mut chunks, off).map_err(rerr)? {
            out.entries.push((off, len));
            off += RECORD_HEADER_LEN as u64 + u64::from(len);
            out.end = off;
            continue;
        }
        if chunks.zeros_from(off).map_err(rerr)? {
            if let ScanMode::Sealed(n) = mode {
                return Err(corrupt(
                    path,
                    id,
                    entry,
                    off,
                    format!("ledger ends after {entry} of {n} entries"),
                ));
            }
            return Ok(out);
        }
        let reason = describe_bad_record(&mut chunks, off);
        if let ScanMode::Live { synced } = mode {
            // Below the published synced offset every record is complete
            // and durable, so a bad one there is damage; past it (or with
            // no hint) the writer may be mid-write: stop, look again later.
            if synced.is_some() {
                return Err(corrupt(
                    path,
                    id,
                    entry,
                    off,
                    format!("{reason} before the synced offset {file_len}"),
                ));
            }
            out.torn = Some(reason);
            return Ok(out);
        }
        // A flipped payload bit leaves the length intact: the record it
        // names next is the first place to look, and a valid one there
        // proves damage in the middle at the cost of one record.
        if let Some(next) = claimed_next(&mut chunks, off).map_err(rerr)? {
            if valid_record_at(&mut chunks, next).map_err(rerr)?.is_some() {
                return Err(corrupt(
                    path,
                    id,
                    entry,
                    off,
                    format!("{reason}, followed by a valid record at offset {next}"),
                ));
            }
        }
        if let ScanMode::Sealed(n) = mode {
            return Err(corrupt(
                path,
                id,
                entry,
                off,
                format!("{reason} in a sealed ledger of {n} entries"),
            ));
        }
        // Recover: cut only a tail proven to hold no valid record.
        if let Some(at) = valid_record_after(&mut chunks, file, off).map_err(rerr)? {
            return Err(corrupt(
                path,
                id,
                entry,
                off,
                format!("{reason}, followed by a valid record at offset {at}"),
            ));
        }
        out.torn = Some(reason);
        return Ok(out);
    }
}

fn describe_bad_record(chunks: &mut Chunks<'_>, off: u64) -> String {
    match chunks.get(off, RECORD_HEADER_LEN) {
        Ok(Some(h)) => {
            let len = le_u32(h) as usize;
            if len > MAX_ENTRY_SIZE {
                format!("record length {len} out of range")
            } else if off + (RECORD_HEADER_LEN + len) as u64 > chunks.file_len {
                format!("record of {len} bytes runs past the end of the file")
            } else {
                "record checksum mismatch".to_owned()
            }
        }
        _ => "partial record header".to_owned(),
    }
}

impl Segment {
    /// Opens an existing ledger file (read-write for the writer).
    pub fn open(dir: &Path, id: u64, writable: bool) -> Result<Self> {
        let path = segment_path(dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(&path)
            .map_err(|e| Error::io(format!("opening ledger file {}", path.display()), &e))?;
        check_header(&file, &path, id)?;
        Ok(Self {
            id,
            path,
            file,
            index: RwLock::new(SegmentIndex {
                end: HEADER_LEN,
                ..SegmentIndex::default()
            }),
        })
    }

    /// Adds scanned entries to the published index.
    pub fn publish_scan(&self, scan: &ScanResult) {
        let mut idx = self.index.write();
        for &(off, len) in &scan.entries {
            idx.offsets.push(off);
            idx.lens.push(len);
        }
        idx.end = idx.end.max(scan.end);
    }

    /// Number of published entries.
    pub fn count(&self) -> u64 {
        self.index.read().count()
    }

    /// Reads entries `[first, first + n)` with one `pread`, verifying every
    /// checksum. The caller checked the range is published.
    pub fn read_entries(&self, first: u64, n: u64) -> Result<Vec<Vec<u8>>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let (start, lens) = {
            let idx = self.index.read();
            let (a, b) = (first as usize, (first + n) as usize);
            if b > idx.offsets.len() {
                return Err(Error::PositionNotFound {
                    position: Position::new(self.id, first + n - 1),
                    reason: format!("ledger {} has {} entries", self.id, idx.count()),
                });
            }
            (idx.offsets[a], idx.lens[a..b].to_vec())
        };
        let total: usize = lens.iter().map(|&l| l as usize + RECORD_HEADER_LEN).sum();
        let mut buf = vec![0u8; total];
        self.file
            .read_exact_at(&mut buf, start)
            .map_err(|e| read_err(&self.path, &e))?;
        let mut out = Vec::with_capacity(lens.len());
        let mut at = 0usize;
        for (i, &len) in lens.iter().enumerate() {
            let h = &buf[at..at + RECORD_HEADER_LEN];
            let payload = &buf[at + RECORD_HEADER_LEN..at + RECORD_HEADER_LEN + len as usize];
            if le_u32(h) != len || le_u32(&h[4..]) != record_crc(payload) {
                return Err(corrupt(
                    &self.path,
                    self.id,
                    first + i as u64,
                    start + at as u64,
                    "record checksum mismatch on read",
                ));
            }
            out.push(payload.to_vec());
            at += RECORD_HEADER_LEN + len as usize;
        }
        Ok(out)
    }
}

/// Reserves `[off, off+len)` on disk, extending the file size.
pub fn preallocate(file: &File, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a valid, owned file descriptor; no memory is shared.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), off as i64, len as i64) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// `fdatasync`: data plus the metadata needed to read it back.
pub fn datasync(file: &File) -> io::Result<()> {
    file.sync_data()
}

/// Syncs a directory so a created, renamed or removed name is durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("syncing directory {}", dir.display()), &e))
}
