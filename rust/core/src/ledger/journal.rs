//! The journal: one write-ahead log per data directory.
//!
//! Every change to any managed ledger of the directory — an entry, a new or
//! sealed ledger, a cursor state, a trim, a compaction, a new managed
//! ledger — is a record appended here, so one `fdatasync` makes a whole
//! group durable whichever ledgers it touches (BookKeeper's journal).
//!
//! # Files
//!
//! `journal/<base>.wal`, `<base>` being 20 decimal digits: segment files.
//! Journal offsets are global: a segment holds the records of offsets
//! `base..`, its record area starting at file offset
//! [`SEGMENT_HEADER_LEN`]. A new segment is started once the current one
//! holds `journal_segment_bytes`, and only once every record of the old one
//! is synced, so damage in an old segment never hides behind a new one.
//!
//! ```text
//! segment header, 64 bytes: magic "TXSJRNL\0" | u32 version=1 | u32 flags=0
//!     | u64 base | 36 zero bytes | u32 crc32c(bytes 0..60)
//! record:  [u32 body_len][u32 body_crc][u8 kind][u8 0][u16 0][u32 head_crc]
//!          [u64 lac][u64 ml][u64 a][u64 b] body
//!   body_crc = crc32c(body_len as u32 LE ++ body)  (a ledger file's record crc)
//!   head_crc = crc32c(bytes 0..12 ++ bytes 16..48)
//! ```
//!
//! `journal/SYNCED`: `[u64 synced end][u32 crc32c][u32 0]`, rewritten after
//! every sync (never synced itself): readers in other processes never read
//! past it.
//!
//! # Acknowledged point (power-loss recovery)
//!
//! `lac` is the journal offset through which everything was synced and
//! acknowledged when the record was built (BookKeeper's last-add-confirmed,
//! piggybacked on later records). After a power cut, unsynced pages may
//! reach the disk in any order, so a damaged record followed by valid ones
//! proves nothing by itself. Recovery takes the durable point `D` = the
//! largest `lac` of any valid record, or the `SYNCED` hint if it survived
//! and is larger. The first damaged record at offset `X`: `X < D` means
//! acknowledged data is damaged, a `CorruptLedger` error; `X >= D` is a torn
//! tail, cut off (and the cut synced).

use super::fs::FsFile;
use crate::error::{Error, Result};
use crate::position::Position;
use std::io;
use std::path::{Path, PathBuf};

/// Directory of the journal inside a data directory.
pub const JOURNAL_DIR: &str = "journal";
/// Suffix of journal segment files.
pub const SEGMENT_SUFFIX: &str = ".wal";
/// Name of the synced-end hint.
pub const SYNCED_FILE: &str = "SYNCED";
/// First bytes of every journal segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"TXSJRNL\0";
/// Version of the journal segment format.
pub const SEGMENT_VERSION: u32 = 1;
/// Size of a segment's header; its first record starts here.
pub const SEGMENT_HEADER_LEN: u64 = 64;
/// Size of a record's header.
pub const RECORD_HEADER_LEN: usize = 48;
/// Largest record body (an entry's payload).
pub const MAX_BODY: usize = super::options::MAX_ENTRY_SIZE;

/// Scans read segment files in chunks of this size.
const SCAN_CHUNK: usize = 4 << 20;

/// What a record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// `ml`, `a` = ledger id, `b` = entry id; body = payload.
    Entry = 1,
    /// A new managed ledger `ml`; body = its name, then (only if its first
    /// ledger id is not 1) a NUL and that id, u64 LE: see [`encode_ml_create`].
    MlCreate = 2,
    /// `ml` starts ledger `a` (the one before it is sealed).
    LedgerOpen = 3,
    /// `ml` seals ledger `a` at `b` entries.
    Seal = 4,
    /// A cursor's state; body = `CursorState` protobuf.
    Cursor = 5,
    /// A cursor is removed; body = its name.
    CursorDelete = 6,
    /// Ledgers dropped from the front; body = their ids (u64 LE each).
    Trim = 7,
    /// Compaction: ledger `a` with `b` entries (records that follow) will
    /// replace every ledger of `ml`.
    ReplaceBegin = 8,
    /// Compaction of `ml` into ledger `a` is complete: swap it in.
    ReplaceCommit = 9,
    /// `ml` is a compacted topic.
    SetCompacted = 10,
    /// `ml` is removed with all its ledgers and cursors; `a` = the lowest
    /// ledger id it never used (0 in directories written before it was
    /// recorded): a later managed ledger of the same name starts there, so
    /// that its files never take the names of files of this one still
    /// waiting to be removed.
    MlDelete = 11,
    /// `ml`, `a` = ledger id, `b` = entry id of a large entry whose record
    /// was written straight into its ledger file (synced in the same group as
    /// this record): body = [`EntryRef`].
    EntryRef = 12,
}

/// Where an [`Kind::EntryRef`] entry's record is: its ledger file offset,
/// payload length and checksum (16 bytes: `u64 offset, u32 len, u32 crc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef {
    /// Offset of the record (its `[len][crc]` header) in the `.log` file.
    pub offset: u64,
    /// Payload length.
    pub len: u32,
    /// Payload checksum ([`body_crc`]).
    pub crc: u32,
}

impl EntryRef {
    /// The record body.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16);
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// Decodes a record body; `None` if it is not 16 bytes or names an
    /// entry larger than any append may be (a reader allocates `len` bytes).
    pub fn decode(b: &[u8]) -> Option<Self> {
        let r = (b.len() == 16).then(|| Self {
            offset: le_u64(b),
            len: le_u32(&b[8..]),
            crc: le_u32(&b[12..]),
        })?;
        (r.len as usize <= super::options::MAX_ENTRY_SIZE).then_some(r)
    }
}

/// The body of a [`Kind::MlCreate`] record: the name, and the first ledger
/// id if it is not `default_first` (a name created again after a deletion
/// starts past the ledger ids of the deleted one). Names never hold a NUL.
pub fn encode_ml_create(name: &str, first_ledger_id: u64, default_first: u64) -> Vec<u8> {
    let mut b = name.as_bytes().to_vec();
    if first_ledger_id != default_first {
        b.push(0);
        b.extend_from_slice(&first_ledger_id.to_le_bytes());
    }
    b
}

/// Decodes a [`Kind::MlCreate`] body: the name and its first ledger id, if
/// recorded; `None` if malformed.
pub fn decode_ml_create(b: &[u8]) -> Option<(&str, Option<u64>)> {
    match b.iter().position(|&c| c == 0) {
        None => Some((std::str::from_utf8(b).ok()?, None)),
        Some(i) => {
            let id: [u8; 8] = b.get(i + 1..)?.try_into().ok()?;
            Some((
                std::str::from_utf8(&b[..i]).ok()?,
                Some(u64::from_le_bytes(id)),
            ))
        }
    }
}

impl Kind {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Entry,
            2 => Self::MlCreate,
            3 => Self::LedgerOpen,
            4 => Self::Seal,
            5 => Self::Cursor,
            6 => Self::CursorDelete,
            7 => Self::Trim,
            8 => Self::ReplaceBegin,
            9 => Self::ReplaceCommit,
            10 => Self::SetCompacted,
            11 => Self::MlDelete,
            12 => Self::EntryRef,
            _ => return None,
        })
    }
}

/// A record's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// What the record says.
    pub kind: Kind,
    /// Journal offset acknowledged when the record was built.
    pub lac: u64,
    /// The managed ledger's journal id.
    pub ml: u64,
    /// First argument (a ledger id).
    pub a: u64,
    /// Second argument (an entry id or a count).
    pub b: u64,
    /// Body length.
    pub body_len: u32,
    /// crc32c(body_len LE ++ body).
    pub body_crc: u32,
}

impl Head {
    /// Bytes the record takes in the journal.
    pub fn size(&self) -> u64 {
        RECORD_HEADER_LEN as u64 + u64::from(self.body_len)
    }

    /// The entry position an `Entry` record holds.
    pub fn position(&self) -> Position {
        Position::new(self.a, self.b)
    }
}

/// crc32c over the four little-endian length bytes followed by the body;
/// also the checksum of a record in a ledger file.
pub fn body_crc(body: &[u8]) -> u32 {
    let len = (body.len() as u32).to_le_bytes();
    crc32c::crc32c_append(crc32c::crc32c(&len), body)
}

/// A little-endian `u32` from the first 4 bytes of `b`.
pub(crate) fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

/// A little-endian `u64` from the first 8 bytes of `b`.
pub(crate) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn head_crc(h: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&h[..12]), &h[16..RECORD_HEADER_LEN])
}

/// Appends a record header for `body` (written separately) to `buf`.
pub fn encode_head(buf: &mut Vec<u8>, kind: Kind, lac: u64, ml: u64, a: u64, b: u64, body: &[u8]) {
    encode_head_crc(buf, kind, lac, ml, a, b, body.len() as u32, body_crc(body));
}

/// Like [`encode_head`] with a precomputed body checksum.
#[allow(clippy::too_many_arguments)]
pub fn encode_head_crc(
    buf: &mut Vec<u8>,
    kind: Kind,
    lac: u64,
    ml: u64,
    a: u64,
    b: u64,
    body_len: u32,
    crc: u32,
) {
    let start = buf.len();
    buf.extend_from_slice(&body_len.to_le_bytes());
    buf.extend_from_slice(&crc.to_le_bytes());
    buf.extend_from_slice(&[kind as u8, 0, 0, 0]);
    buf.extend_from_slice(&[0u8; 4]);
    buf.extend_from_slice(&lac.to_le_bytes());
    buf.extend_from_slice(&ml.to_le_bytes());
    buf.extend_from_slice(&a.to_le_bytes());
    buf.extend_from_slice(&b.to_le_bytes());
    let c = head_crc(&buf[start..]);
    buf[start + 12..start + 16].copy_from_slice(&c.to_le_bytes());
}

/// Decodes a record header; `None` if it does not check out (zeros,
/// garbage, a torn write).
pub fn decode_head(h: &[u8]) -> Option<Head> {
    // Cheap field checks first: a search calls this at every byte offset.
    if h.len() < RECORD_HEADER_LEN || h[9] != 0 || h[10] != 0 || h[11] != 0 {
        return None;
    }
    Kind::from_u8(h[8])?;
    if head_crc(h) != le_u32(&h[12..]) {
        return None;
    }
    let body_len = le_u32(h);
    if body_len as usize > MAX_BODY {
        return None;
    }
    Some(Head {
        kind: Kind::from_u8(h[8])?,
        lac: le_u64(&h[16..]),
        ml: le_u64(&h[24..]),
        a: le_u64(&h[32..]),
        b: le_u64(&h[40..]),
        body_len,
        body_crc: le_u32(&h[4..]),
    })
}

/// The 64-byte header of the segment starting at journal offset `base`.
pub fn encode_segment_header(base: u64) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&base.to_le_bytes());
    let crc = crc32c::crc32c(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Path of the segment starting at journal offset `base`.
pub fn segment_path(data_dir: &Path, base: u64) -> PathBuf {
    data_dir
        .join(JOURNAL_DIR)
        .join(format!("{base:020}{SEGMENT_SUFFIX}"))
}

/// Path of the synced-end hint.
pub fn synced_path(data_dir: &Path) -> PathBuf {
    data_dir.join(JOURNAL_DIR).join(SYNCED_FILE)
}

/// Parses a segment file name into its base offset.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The synced-end hint's 16 bytes.
pub fn encode_synced(end: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&end.to_le_bytes());
    let crc = crc32c::crc32c(&b[..8]);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes the hint; `None` if damaged or short.
pub fn decode_synced(b: &[u8]) -> Option<u64> {
    if b.len() < 12 || crc32c::crc32c(&b[..8]) != le_u32(&b[8..]) {
        return None;
    }
    Some(le_u64(b))
}

/// A `CorruptLedger` error about a journal file.
pub fn corrupt(path: &Path, offset: u64, position: Position, reason: impl Into<String>) -> Error {
    Error::CorruptLedger {
        path: path.display().to_string(),
        position,
        offset,
        reason: reason.into(),
    }
}

fn read_err(path: &Path, e: &io::Error) -> Error {
    Error::io(format!("reading journal file {}", path.display()), e)
}

/// Validates a segment's header; its base offset.
pub fn check_segment_header(file: &dyn FsFile, path: &Path, expect_base: u64) -> Result<()> {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    file.read_exact_at(&mut h, 0).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            corrupt(path, 0, Position::default(), "file shorter than its header")
        } else {
            read_err(path, &e)
        }
    })?;
    if h[..8] != SEGMENT_MAGIC {
        return Err(corrupt(path, 0, Position::default(), "bad magic"));
    }
    if crc32c::crc32c(&h[..60]) != le_u32(&h[60..]) {
        return Err(corrupt(
            path,
            0,
            Position::default(),
            "header checksum mismatch",
        ));
    }
    let version = le_u32(&h[8..]);
    if version != SEGMENT_VERSION {
        return Err(corrupt(
            path,
            0,
            Position::default(),
            format!("unsupported journal segment version {version} (this build reads {SEGMENT_VERSION})"),
        ));
    }
    let base = le_u64(&h[16..]);
    if base != expect_base {
        return Err(corrupt(
            path,
            0,
            Position::default(),
            format!("header says base {base}, file name says {expect_base}"),
        ));
    }
    Ok(())
}

/// A record seen by a scan.
#[derive(Debug)]
pub struct Seen<'a> {
    /// Its journal offset.
    pub at: u64,
    /// Its header.
    pub head: Head,
    /// Its body.
    pub body: &'a [u8],
}

/// Where and why a scan stopped early.
#[derive(Debug, Clone)]
pub struct Damage {
    /// Journal offset of the first record that does not check out.
    pub at: u64,
    /// What is wrong with it.
    pub reason: String,
    /// Its header, if that part is intact (then the body is damaged).
    pub head: Option<Head>,
}

/// Outcome of scanning one segment.
#[derive(Debug)]
pub struct SegmentScan {
    /// Journal offset just past the last valid record.
    pub end: u64,
    /// Set if the scan stopped on non-zero bytes (not a clean end).
    pub damage: Option<Damage>,
    /// Largest `lac` of the valid records seen.
    pub max_lac: u64,
}

/// Sequential chunked reader of one segment's record area.
struct Reader<'a> {
    file: &'a dyn FsFile,
    /// File length (clipped for a live reader).
    len: u64,
    buf: Vec<u8>,
    start: u64,
}

impl<'a> Reader<'a> {
    /// Bytes at file offsets `[off, off+n)`, or `None` past the end.
    fn get(&mut self, off: u64, n: usize) -> io::Result<Option<&[u8]>> {
        let Some(end) = off.checked_add(n as u64) else {
            return Ok(None);
        };
        if end > self.len {
            return Ok(None);
        }
        if off < self.start || end > self.start + self.buf.len() as u64 {
            let want = (n.max(SCAN_CHUNK) as u64).min(self.len - off) as usize;
            self.buf.resize(want, 0);
            let mut got = 0;
            while got < want {
                match self.file.read_at(&mut self.buf[got..], off + got as u64) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.buf.truncate(got);
            self.start = off;
            if (got as u64) < end - off {
                self.len = off + got as u64;
                return Ok(None);
            }
        }
        let s = (off - self.start) as usize;
        Ok(Some(&self.buf[s..s + n]))
    }

    fn all_zero_from(&mut self, mut off: u64) -> io::Result<bool> {
        while off < self.len {
            let n = (SCAN_CHUNK as u64).min(self.len - off) as usize;
            match self.get(off, n)? {
                Some(b) if b.iter().all(|&x| x == 0) => off += n as u64,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// Checks the record at file offset `off`: its header, and whether its
/// body checks out.
fn record_at(r: &mut Reader<'_>, off: u64) -> io::Result<Result<Head, (String, Option<Head>)>> {
    let Some(h) = r.get(off, RECORD_HEADER_LEN)? else {
        return Ok(Err(("partial record header".to_owned(), None)));
    };
    let Some(head) = decode_head(h) else {
        return Ok(Err(("record header checksum mismatch".to_owned(), None)));
    };
    let body_off = off + RECORD_HEADER_LEN as u64;
    match r.get(body_off, head.body_len as usize)? {
        None => Ok(Err((
            format!(
                "record of {} bytes runs past the end of the file",
                head.body_len
            ),
            Some(head),
        ))),
        Some(body) if body_crc(body) != head.body_crc => Ok(Err((
            "record body checksum mismatch".to_owned(),
            Some(head),
        ))),
        Some(_) => Ok(Ok(head)),
    }
}

/// Scans the records of the segment at `base` from journal offset `from`
/// (a record boundary), calling `f` for each valid one, up to `limit`
/// (exclusive; `None`: the whole file). Stops at the first record that does
/// not check out, reporting it as damage unless only zeros follow.
pub fn scan_segment(
    file: &dyn FsFile,
    path: &Path,
    base: u64,
    from: u64,
    limit: Option<u64>,
    mut f: impl FnMut(Seen<'_>) -> Result<()>,
) -> Result<SegmentScan> {
    scan_segment_checked(file, path, base, from, limit, |s| f(s).map(|()| None))
}

/// Like [`scan_segment`], but `f` may also refuse a record that checks out
/// in the journal (`Ok(Some(reason))`: e.g. the ledger-file data an
/// [`Kind::EntryRef`] points to does not): the scan stops there and reports
/// it as damage at that record.
pub fn scan_segment_checked(
    file: &dyn FsFile,
    path: &Path,
    base: u64,
    from: u64,
    limit: Option<u64>,
    mut f: impl FnMut(Seen<'_>) -> Result<Option<String>>,
) -> Result<SegmentScan> {
    let mut len = file.size().map_err(|e| read_err(path, &e))?;
    if let Some(l) = limit {
        len = len.min(SEGMENT_HEADER_LEN + (l.saturating_sub(base)));
    }
    let mut r = Reader {
        file,
        len,
        buf: Vec::new(),
        start: 0,
    };
    let mut off = SEGMENT_HEADER_LEN + (from - base);
    let mut out = SegmentScan {
        end: from,
        damage: None,
        max_lac: 0,
    };
    let rerr = |e: io::Error| read_err(path, &e);
    loop {
        if off >= r.len {
            return Ok(out);
        }
        match record_at(&mut r, off).map_err(rerr)? {
            Ok(head) => {
                let body_off = off + RECORD_HEADER_LEN as u64;
                let body = r
                    .get(body_off, head.body_len as usize)
                    .map_err(rerr)?
                    .unwrap_or(&[]);
                let at = base + (off - SEGMENT_HEADER_LEN);
                // Its lac holds even if `f` refuses the record: the
                // journal part checks out.
                out.max_lac = out.max_lac.max(head.lac);
                if let Some(reason) = f(Seen { at, head, body })? {
                    out.damage = Some(Damage {
                        at,
                        reason,
                        head: Some(head),
                    });
                    return Ok(out);
                }
                off = body_off + u64::from(head.body_len);
                out.end = base + (off - SEGMENT_HEADER_LEN);
            }
            Err((reason, head)) => {
                if head.is_none() && r.all_zero_from(off).map_err(rerr)? {
                    return Ok(out);
                }
                out.damage = Some(Damage {
                    at: base + (off - SEGMENT_HEADER_LEN),
                    reason,
                    head,
                });
                return Ok(out);
            }
        }
    }
}

/// The largest `lac` of any valid record starting after journal offset
/// `after` in the segment at `base` (a search at every byte offset, skipping
/// zero runs: a header needs non-zero bytes). Used only after damage.
pub fn max_lac_after(file: &dyn FsFile, path: &Path, base: u64, after: u64) -> Result<u64> {
    let len = file.size().map_err(|e| read_err(path, &e))?;
    let mut r = Reader {
        file,
        len,
        buf: Vec::new(),
        start: 0,
    };
    let rerr = |e: io::Error| read_err(path, &e);
    let mut best = 0u64;
    let mut off = SEGMENT_HEADER_LEN + (after - base) + 1;
    while off + RECORD_HEADER_LEN as u64 <= r.len {
        let Some(h) = r.get(off, RECORD_HEADER_LEN).map_err(rerr)? else {
            break;
        };
        // A valid header's body crc is never zero (it covers the length).
        if h[4..8].iter().all(|&b| b == 0) {
            off += 1;
            continue;
        }
        if decode_head(h).is_some() {
            if let Ok(head) = record_at(&mut r, off).map_err(rerr)? {
                best = best.max(head.lac);
                off += head.size();
                continue;
            }
        }
        off += 1;
    }
    Ok(best)
}
