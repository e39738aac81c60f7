//! The in-memory state of managed ledgers, and the one place it changes:
//! [`MlState::apply`] applies a journal record. The writer applies what it
//! wrote once it is durable (publishing it), recovery applies the journal
//! tail after the catalog, a read-only reader applies what it scans: one
//! state machine, three users.
//!
//! A ledger's entries live in two places: `[0, file_entries)` in its
//! `.log`/`.idx` files (written behind the journal by the flusher), and
//! `[file_entries, count)` still only in the journal (`tail`, their journal
//! locations).

use super::cursor::{CursorData, CursorInner, HOLD_CURSOR_PREFIX};
use super::fault::FaultInjector;
use super::fault::FaultKind;
use super::fs::{Fs, FsFile, OpenMode};
use super::journal::{self, Head, Kind, RECORD_HEADER_LEN};
use super::ledger_file::{self, LedgerFiles};
use crate::error::{Error, Result};
use crate::position::Position;
use crate::proto::{CursorState, LedgerInfo, ManagedLedgerState};
use crate::sync::{Mutex, RwLock};
use prost::Message;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// First ledger id of a new managed ledger.
pub(crate) const FIRST_LEDGER_ID: u64 = 1;
/// Highest entry id a cursor record can store (its mark-delete entry id is an `int64`).
pub(crate) const MAX_STORED_ENTRY_ID: u64 = i64::MAX as u64;

/// Where an entry not yet written behind is: its journal record, or (a
/// large entry) its record in the ledger file, written there directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    /// Journal offset of the record (`Entry` or `EntryRef`).
    pub at: u64,
    /// Payload length.
    pub len: u32,
    /// Payload checksum ([`journal::body_crc`]).
    pub crc: u32,
    /// `.log` offset of its record, if it was written there directly.
    pub direct: Option<u64>,
}

/// One ledger of a managed ledger.
#[derive(Debug, Default, Clone)]
pub(crate) struct LedgerState {
    /// Durable (published) entries.
    pub count: u64,
    /// Entry count once sealed.
    pub sealed: Option<u64>,
    /// Entries in the ledger's files.
    pub file_entries: u64,
    /// End of the `.log` file's records.
    pub file_bytes: u64,
    /// Journal locations of entries `[file_entries, count)`.
    pub tail: VecDeque<Loc>,
}

impl LedgerState {
    fn new() -> Self {
        Self {
            file_bytes: ledger_file::HEADER_LEN,
            ..Self::default()
        }
    }
}

/// Bookkeeping of one managed ledger besides its ledgers.
#[derive(Debug, Default)]
pub(crate) struct MetaState {
    pub next_ledger_id: u64,
    /// The ledger appends go to, if one is open.
    pub active: Option<u64>,
    pub compacted: bool,
    /// Cursor states as persisted, for cursors not open now.
    pub persisted_cursors: BTreeMap<String, CursorData>,
    /// A compaction whose commit record has not been applied yet
    /// (recovery and read-only scans): ledger id, entry count, the ledger.
    pub replace: Option<(u64, u64, LedgerState)>,
    /// Removed (`MlDelete`).
    pub deleted: bool,
}

/// Rollover thresholds of a managed ledger (per open).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rollover {
    pub max_entries: u64,
    pub max_bytes: u64,
}

/// How [`StoreIo::ledger_files`] opens a ledger's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileOpen {
    /// Files that hold entries (reads, syncs).
    Existing,
    /// The write-behind's files of a ledger with entries in them already.
    Create,
    /// The first write to a ledger's files (write-behind, or a large entry
    /// written directly): write their headers, whatever a crash left there.
    Fresh,
}

/// Open files of one ledger.
#[derive(Debug, Clone)]
pub(crate) struct LedgerHandles {
    pub log: Arc<dyn FsFile>,
    pub idx: Arc<dyn FsFile>,
    pub log_path: PathBuf,
    pub idx_path: PathBuf,
}

impl LedgerHandles {
    pub fn files(&self, id: u64) -> LedgerFiles<'_> {
        LedgerFiles {
            id,
            log: self.log.as_ref(),
            log_path: &self.log_path,
            idx: self.idx.as_ref(),
            idx_path: &self.idx_path,
        }
    }
}

/// A least-recently-used cache of ledger file handles: descriptors stay
/// bounded whatever the number of ledgers.
#[derive(Debug, Default)]
pub(crate) struct FileCache {
    map: HashMap<(u64, u64), (LedgerHandles, u64)>,
    tick: u64,
    cap: usize,
}

impl FileCache {
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            ..Self::default()
        }
    }

    fn get(&mut self, key: (u64, u64)) -> Option<LedgerHandles> {
        self.tick += 1;
        let t = self.tick;
        self.map.get_mut(&key).map(|(h, used)| {
            *used = t;
            h.clone()
        })
    }

    fn put(&mut self, key: (u64, u64), h: LedgerHandles) {
        if self.map.len() >= self.cap {
            if let Some(&old) = self.map.iter().min_by_key(|(_, (_, u))| *u).map(|(k, _)| k) {
                self.map.remove(&old);
            }
        }
        self.tick += 1;
        self.map.insert(key, (h, self.tick));
    }

    /// Forgets the handles of ledger `key` (before its files are removed).
    pub fn evict(&mut self, key: (u64, u64)) {
        self.map.remove(&key);
    }

    /// Forgets every ledger of managed ledger `ml`.
    pub fn evict_ml(&mut self, ml: u64) {
        self.map.retain(|k, _| k.0 != ml);
    }

    /// Open descriptors (two per cached ledger).
    pub fn descriptors(&self) -> usize {
        self.map.len() * 2
    }
}

/// The I/O side of a data directory that managed ledgers read through:
/// open journal segments and a cache of ledger files.
#[derive(Debug)]
pub(crate) struct StoreIo {
    pub fs: Arc<dyn Fs>,
    pub data_dir: PathBuf,
    pub read_only: bool,
    pub faults: Arc<FaultInjector>,
    /// Journal segments by base offset (only existing ones).
    pub segments: RwLock<BTreeMap<u64, Arc<dyn FsFile>>>,
    pub files: Mutex<FileCache>,
    /// Entry reads served from ledger files / from the journal.
    pub file_reads: AtomicU64,
    pub journal_reads: AtomicU64,
}

impl StoreIo {
    /// The test hook in front of every read.
    fn read_fault(&self, name: &str) -> Result<()> {
        self.faults
            .check(FaultKind::Read)
            .map_err(|e| Error::io(format!("reading managed ledger {name:?}"), &e))
    }

    /// Handles of ledger `ledger` of `ml`, opening its files if needed.
    /// `Create`: the write-behind's open; `Fresh`: the same, for a ledger
    /// with no entry in its files yet, whose headers (if any) are not to be
    /// trusted (a crash may have left them half-written) and are rewritten.
    pub fn ledger_files(&self, ml: &MlState, ledger: u64, how: FileOpen) -> Result<LedgerHandles> {
        if how != FileOpen::Fresh {
            if let Some(h) = self.files.lock().get((ml.id, ledger)) {
                return Ok(h);
            }
        }
        let log_path = ledger_file::log_path(&ml.prefix, ledger);
        let idx_path = ledger_file::idx_path(&ml.prefix, ledger);
        let open = |path: &Path, idx: bool| -> Result<Arc<dyn FsFile>> {
            let ctx = |e: &std::io::Error| Error::io(format!("opening {}", path.display()), e);
            match how {
                FileOpen::Existing => {
                    let mode = if self.read_only {
                        OpenMode::READ
                    } else {
                        OpenMode::WRITE
                    };
                    let f = self.fs.open(path, mode).map_err(|e| ctx(&e))?;
                    ledger_file::check_header(f.as_ref(), path, ledger, idx)?;
                    Ok(f)
                }
                FileOpen::Create => {
                    let f = self.fs.open(path, OpenMode::CREATE).map_err(|e| ctx(&e))?;
                    ledger_file::check_header(f.as_ref(), path, ledger, idx)?;
                    Ok(f)
                }
                FileOpen::Fresh => {
                    // Only the header is rewritten: bytes after it are
                    // never read unless an index slot and their checksum
                    // vouch for them, and large entries may already have
                    // been written there directly.
                    let f = self.fs.open(path, OpenMode::CREATE).map_err(|e| ctx(&e))?;
                    f.write_all_at(&ledger_file::encode_header(ledger, idx), 0)
                        .map_err(|e| ctx(&e))?;
                    Ok(f)
                }
            }
        };
        let h = LedgerHandles {
            log: open(&log_path, false)?,
            idx: open(&idx_path, true)?,
            log_path,
            idx_path,
        };
        self.files.lock().put((ml.id, ledger), h.clone());
        Ok(h)
    }

    /// Reads a large entry's record where the writer put it in the ledger
    /// file, verifying it.
    pub fn read_direct(&self, ml: &MlState, pos: Position, off: u64, loc: &Loc) -> Result<Vec<u8>> {
        let h = self.ledger_files(ml, pos.ledger_id, FileOpen::Existing)?;
        let mut buf = vec![0u8; ledger_file::RECORD_HEADER_LEN + loc.len as usize];
        h.log.read_exact_at(&mut buf, off).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                ledger_file::corrupt(
                    &h.log_path,
                    pos.ledger_id,
                    pos.entry_id,
                    off,
                    "data file is shorter than a published entry",
                )
            } else {
                Error::io(format!("reading {}", h.log_path.display()), &e)
            }
        })?;
        let payload = buf.split_off(ledger_file::RECORD_HEADER_LEN);
        let ok = journal::le_u32(&buf) == loc.len
            && journal::le_u32(&buf[4..]) == loc.crc
            && journal::body_crc(&payload) == loc.crc;
        if !ok {
            return Err(ledger_file::corrupt(
                &h.log_path,
                pos.ledger_id,
                pos.entry_id,
                off,
                "record checksum mismatch on read",
            ));
        }
        Ok(payload)
    }

    /// Reads one journal record's body at `loc`, verifying it.
    fn read_journal(
        &self,
        ml: &MlState,
        p: Position,
        locs: &[Loc],
    ) -> Result<Option<Vec<Vec<u8>>>> {
        let mut out = Vec::with_capacity(locs.len());
        let segments = self.segments.read();
        let mut i = 0;
        while i < locs.len() {
            if let Some(off) = locs[i].direct {
                let pos = Position::new(p.ledger_id, p.entry_id + i as u64);
                out.push(self.read_direct(ml, pos, off, &locs[i])?);
                i += 1;
                continue;
            }
            let Some((&base, file)) = segments.range(..=locs[i].at).next_back() else {
                return Ok(None);
            };
            let file = Arc::clone(file);
            // A run of records back to back in one segment: one read.
            let mut j = i + 1;
            let mut end = locs[i].at + RECORD_HEADER_LEN as u64 + u64::from(locs[i].len);
            while j < locs.len() && locs[j].direct.is_none() && locs[j].at == end {
                end += RECORD_HEADER_LEN as u64 + u64::from(locs[j].len);
                j += 1;
            }
            if segments.range(base + 1..end).next().is_some() {
                // Crosses into the next segment: read one at a time.
                j = i + 1;
                end = locs[i].at + RECORD_HEADER_LEN as u64 + u64::from(locs[i].len);
            }
            let start = locs[i].at;
            let mut buf = vec![0u8; (end - start) as usize];
            let path = journal::segment_path(&self.data_dir, base);
            let off = journal::SEGMENT_HEADER_LEN + (start - base);
            match file.read_exact_at(&mut buf, off) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(journal::corrupt(
                        &path,
                        off,
                        p,
                        "journal shorter than a published record",
                    ));
                }
                Err(e) => return Err(Error::io(format!("reading {}", path.display()), &e)),
            }
            let mut at = 0usize;
            for (k, loc) in locs[i..j].iter().enumerate() {
                let head = journal::decode_head(&buf[at..at + RECORD_HEADER_LEN]);
                let body = &buf[at + RECORD_HEADER_LEN..at + RECORD_HEADER_LEN + loc.len as usize];
                let pos = Position::new(p.ledger_id, p.entry_id + (i + k) as u64);
                let ok = head.is_some_and(|h| {
                    h.kind == Kind::Entry
                        && h.ml == ml.id
                        && h.position() == pos
                        && h.body_crc == loc.crc
                }) && journal::body_crc(body) == loc.crc;
                if !ok {
                    return Err(journal::corrupt(
                        &path,
                        off + at as u64,
                        pos,
                        "journal record checksum mismatch on read",
                    ));
                }
                out.push(body.to_vec());
                at += RECORD_HEADER_LEN + loc.len as usize;
            }
            i = j;
        }
        self.journal_reads
            .fetch_add(locs.len() as u64, Ordering::Relaxed);
        Ok(Some(out))
    }
}

/// One managed ledger's state, shared by its handles, the storage threads
/// and the catalog.
///
/// Lock order: `meta`, then `cursors`, then a cursor's `data`, then
/// `ledgers`. None is held across a journal write (publishing a group takes
/// `meta` and `ledgers`).
pub(crate) struct MlState {
    /// Journal id.
    pub id: u64,
    pub name: String,
    /// `<data>/ledgers/<escaped name>`: its files are `<prefix>@<id>.log`
    /// and `.idx`.
    pub prefix: PathBuf,
    /// Its files were checked against its state (once per store).
    pub checked: AtomicBool,
    pub io: Arc<StoreIo>,
    pub ledgers: RwLock<BTreeMap<u64, LedgerState>>,
    pub meta: Mutex<MetaState>,
    pub cursors: Mutex<BTreeMap<String, Arc<CursorInner>>>,
    /// A cursor changed since its state was last journaled.
    pub cursors_dirty: AtomicBool,
    /// Orders cursor records in the journal: held from encoding cursor
    /// states until their records are queued, and by a cursor's deletion
    /// until it is durable and forgotten, so a state encoded before a
    /// deletion is never journaled after it (which would bring the deleted
    /// cursor back). Taken before any other lock here; never by the
    /// journal threads.
    pub cursor_journal: Mutex<()>,
    /// A writable handle is open.
    pub open: AtomicBool,
    pub rollover: Mutex<Rollover>,
    /// Whether its creation record is durable: [`CREATED`], [`CREATING`]
    /// (written, not yet synced) or [`CREATE_FAILED`] (set by the journal
    /// writer, which then fails every later command of this ledger: its
    /// records must never reach the journal without the creation before
    /// them).
    pub created: AtomicU8,
}

/// [`MlState::created`]: durable (or loaded from disk).
pub(crate) const CREATED: u8 = 0;
/// [`MlState::created`]: the creation record is queued or in flight.
pub(crate) const CREATING: u8 = 1;
/// [`MlState::created`]: the creation record failed.
pub(crate) const CREATE_FAILED: u8 = 2;

impl fmt::Debug for MlState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MlState")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What applying a record left for the storage threads to do.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// Ledgers that left the managed ledger (their files can go once a
    /// checkpoint no longer lists them).
    pub dropped: Vec<u64>,
    /// New entries went to the journal tail.
    pub appended: bool,
}

fn corrupt_record(io: &StoreIo, at: u64, p: Position, reason: String) -> Error {
    Error::CorruptLedger {
        path: io.data_dir.join(journal::JOURNAL_DIR).display().to_string(),
        position: p,
        offset: at,
        reason,
    }
}

impl MlState {
    pub fn new(
        id: u64,
        name: String,
        prefix: PathBuf,
        io: Arc<StoreIo>,
        rollover: Rollover,
    ) -> Self {
        Self {
            id,
            name,
            prefix,
            checked: AtomicBool::new(false),
            io,
            ledgers: RwLock::new(BTreeMap::new()),
            meta: Mutex::new(MetaState {
                next_ledger_id: FIRST_LEDGER_ID,
                ..MetaState::default()
            }),
            cursors: Mutex::new(BTreeMap::new()),
            cursors_dirty: AtomicBool::new(false),
            cursor_journal: Mutex::new(()),
            open: AtomicBool::new(false),
            rollover: Mutex::new(rollover),
            created: AtomicU8::new(CREATED),
        }
    }

    /// Its creation record is about to be queued.
    pub fn mark_creating(&self) {
        self.created.store(CREATING, Ordering::Release);
    }

    /// True if its creation record failed (it can take no more records).
    pub fn creation_failed(&self) -> bool {
        self.created.load(Ordering::Acquire) == CREATE_FAILED
    }

    /// Loads the catalog's view of this managed ledger.
    pub fn load(&self, s: &ManagedLedgerState) -> Result<()> {
        let mut ledgers = BTreeMap::new();
        for info in &s.ledgers {
            let file_entries = info.file_entries.unwrap_or(0);
            let file_bytes = info.size_bytes.unwrap_or(ledger_file::HEADER_LEN);
            // Every entry in the files takes a record header there: a count the
            // file cannot hold is damage, not a size to trust (reads would
            // compute offsets from it).
            let fits = (file_bytes - ledger_file::HEADER_LEN.min(file_bytes))
                / ledger_file::RECORD_HEADER_LEN as u64;
            if info.entries.is_some_and(|n| n < file_entries)
                || !(ledger_file::HEADER_LEN..=ledger_file::MAX_LOG_BYTES).contains(&file_bytes)
                || file_entries > fits
            {
                return Err(
                    self.bad_catalog(format!("ledger {} has inconsistent counts", info.ledger_id))
                );
            }
            ledgers.insert(
                info.ledger_id,
                LedgerState {
                    count: file_entries,
                    sealed: info.entries,
                    file_entries,
                    file_bytes,
                    tail: VecDeque::new(),
                },
            );
        }
        let mut persisted = BTreeMap::new();
        for c in &s.cursors {
            let d = CursorData::from_proto(c).map_err(|r| self.bad_catalog(r))?;
            persisted.insert(c.name.clone(), d);
        }
        let mut m = self.meta.lock();
        m.next_ledger_id = s.next_ledger_id;
        m.compacted = s.compacted.unwrap_or(false);
        m.active = ledgers
            .iter()
            .next_back()
            .filter(|(_, l)| l.sealed.is_none())
            .map(|(&id, _)| id);
        m.persisted_cursors = persisted;
        m.replace = None;
        m.deleted = false;
        if ledgers.keys().any(|&id| id >= m.next_ledger_id) {
            return Err(self.bad_catalog("a ledger id at or past next_ledger_id".to_owned()));
        }
        *self.ledgers.write() = ledgers;
        Ok(())
    }

    fn bad_catalog(&self, reason: String) -> Error {
        Error::CorruptLedger {
            path: self
                .io
                .data_dir
                .join(super::catalog::CATALOG_FILE)
                .display()
                .to_string(),
            position: Position::default(),
            offset: 0,
            reason: format!("managed ledger {:?}: {reason}", self.name),
        }
    }

    /// Takes over `other`'s ledgers and bookkeeping at once (a read-only
    /// reload; `other` is a private copy).
    pub fn adopt(&self, other: &MlState) {
        let mut m = self.meta.lock();
        let mut om = other.meta.lock();
        let mut ledgers = self.ledgers.write();
        *ledgers = std::mem::take(&mut *other.ledgers.write());
        m.next_ledger_id = om.next_ledger_id;
        m.active = om.active;
        m.compacted = om.compacted;
        m.persisted_cursors = std::mem::take(&mut om.persisted_cursors);
        m.replace = om.replace.take();
        m.deleted = om.deleted;
    }

    /// This managed ledger as the catalog stores it.
    pub fn snapshot(&self) -> ManagedLedgerState {
        let m = self.meta.lock();
        let ledgers = self
            .ledgers
            .read()
            .iter()
            .map(|(&id, l)| LedgerInfo {
                ledger_id: id,
                entries: l.sealed,
                size_bytes: Some(l.file_bytes),
                file_entries: Some(l.file_entries),
            })
            .collect();
        let mut cursors: BTreeMap<String, CursorState> = m
            .persisted_cursors
            .iter()
            .map(|(n, d)| (n.clone(), d.to_proto(n)))
            .collect();
        for (n, c) in self.cursors.lock().iter() {
            cursors.insert(n.clone(), c.data.lock().to_proto(n));
        }
        ManagedLedgerState {
            id: self.id,
            name: self.name.clone(),
            ledgers,
            cursors: cursors.into_values().collect(),
            next_ledger_id: m.next_ledger_id,
            compacted: Some(m.compacted),
        }
    }

    /// Applies one journal record (see the module docs). `at` is its journal
    /// offset; `body` its body (may be empty for `Entry`).
    pub fn apply(&self, at: u64, head: &Head, body: &[u8]) -> Result<Applied> {
        let mut out = Applied::default();
        let mut m = self.meta.lock();
        let bad = |reason: String| corrupt_record(&self.io, at, head.position(), reason);
        match head.kind {
            Kind::Entry | Kind::EntryRef => {
                let loc = if head.kind == Kind::Entry {
                    Loc {
                        at,
                        len: head.body_len,
                        crc: head.body_crc,
                        direct: None,
                    }
                } else {
                    let r = journal::EntryRef::decode(body)
                        .ok_or_else(|| bad("malformed entry reference".to_owned()))?;
                    Loc {
                        at,
                        len: r.len,
                        crc: r.crc,
                        direct: Some(r.offset),
                    }
                };
                if let Some((id, n, l)) = m.replace.as_mut() {
                    if *id == head.a {
                        if head.b != l.count || l.count >= *n {
                            return Err(bad(format!("compaction entry {} out of order", head.b)));
                        }
                        l.count += 1;
                        l.tail.push_back(loc);
                        return Ok(out);
                    }
                }
                let mut ledgers = self.ledgers.write();
                let Some(l) = ledgers.get_mut(&head.a) else {
                    if head.a < m.next_ledger_id {
                        return Ok(out); // trimmed or compacted away since
                    }
                    return Err(bad(format!(
                        "entry of ledger {} that was never opened",
                        head.a
                    )));
                };
                if head.b < l.count {
                    return Ok(out); // already in the ledger's files
                }
                if head.b > l.count || l.sealed.is_some_and(|n| head.b >= n) {
                    return Err(bad(format!(
                        "entry {} of ledger {} out of order (ledger has {} entries{})",
                        head.b,
                        head.a,
                        l.count,
                        l.sealed
                            .map(|n| format!(", sealed at {n}"))
                            .unwrap_or_default()
                    )));
                }
                l.count += 1;
                l.tail.push_back(loc);
                out.appended = true;
            }
            Kind::LedgerOpen => {
                let Some(next_id) = head.a.checked_add(1) else {
                    return Err(bad(format!("ledger id {} opened", head.a)));
                };
                if m.replace.as_ref().is_some_and(|r| r.0 == head.a) {
                    // A ledger opened under the id of a compaction never committed
                    // (a directory written before aborted compactions kept their
                    // ids): the compaction was abandoned; what follows is the ledger's.
                    m.replace = None;
                }
                let mut ledgers = self.ledgers.write();
                if ledgers.contains_key(&head.a) || head.a < m.next_ledger_id {
                    return Ok(out);
                }
                if let Some(prev) = m.active.and_then(|id| ledgers.get_mut(&id)) {
                    prev.sealed.get_or_insert(prev.count);
                }
                ledgers.insert(head.a, LedgerState::new());
                m.active = Some(head.a);
                m.next_ledger_id = next_id;
            }
            Kind::Seal => {
                let mut ledgers = self.ledgers.write();
                if let Some(l) = ledgers.get_mut(&head.a) {
                    if l.count > head.b {
                        return Err(bad(format!(
                            "ledger {} sealed at {} but has {} entries",
                            head.a, head.b, l.count
                        )));
                    }
                    l.sealed = Some(head.b);
                }
                if m.active == Some(head.a) {
                    m.active = None;
                }
            }
            Kind::Cursor => {
                let s = CursorState::decode(body)
                    .map_err(|e| bad(format!("undecodable cursor state: {e}")))?;
                let d = CursorData::from_proto(&s).map_err(bad)?;
                m.persisted_cursors.insert(s.name, d);
            }
            Kind::CursorDelete => {
                let name = std::str::from_utf8(body)
                    .map_err(|_| bad("cursor name is not UTF-8".to_owned()))?;
                m.persisted_cursors.remove(name);
                // And the open cursor, here rather than after the deleting
                // caller wakes: a checkpoint whose journal position covers
                // this record must not snapshot the cursor (a power cut
                // would then bring it back).
                self.cursors.lock().remove(name);
            }
            Kind::Trim => {
                if body.len() % 8 != 0 {
                    return Err(bad("trim record of odd length".to_owned()));
                }
                let mut ledgers = self.ledgers.write();
                for chunk in body.chunks_exact(8) {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(chunk);
                    let id = u64::from_le_bytes(b);
                    if ledgers.remove(&id).is_some() {
                        out.dropped.push(id);
                    }
                    if m.active == Some(id) {
                        m.active = None;
                    }
                }
            }
            Kind::ReplaceBegin => {
                if head.a == u64::MAX {
                    return Err(bad(format!("compaction into ledger id {}", head.a)));
                }
                if self.ledgers.read().contains_key(&head.a) || head.a < m.next_ledger_id {
                    return Ok(out); // the catalog has it already
                }
                m.replace = Some((head.a, head.b, LedgerState::new()));
            }
            Kind::ReplaceCommit => {
                let Some((id, n, mut l)) = m.replace.take() else {
                    return Ok(out); // the catalog has it already
                };
                if id != head.a || l.count != n {
                    return Err(bad(format!(
                        "compaction into ledger {id} commits ledger {} after {} of {n} entries",
                        head.a, l.count
                    )));
                }
                l.sealed = Some(n);
                let mut ledgers = self.ledgers.write();
                out.dropped.extend(ledgers.keys().copied());
                ledgers.clear();
                ledgers.insert(id, l);
                m.active = None;
                m.next_ledger_id = id.saturating_add(1); // not u64::MAX: ReplaceBegin refused it
                out.appended = n > 0;
            }
            Kind::SetCompacted => m.compacted = true,
            // Its ledger ids end here (see `Kind::MlDelete`).
            Kind::MlDelete => m.next_ledger_id = m.next_ledger_id.max(head.a),
            Kind::MlCreate => {}
        }
        Ok(out)
    }

    /// Seals every open ledger at its count (after recovery: appends go to
    /// a new ledger). Fails if a sealed ledger lacks entries.
    pub fn finish_recovery(&self) -> Result<()> {
        let mut m = self.meta.lock();
        if let Some((id, _, _)) = m.replace.take() {
            // A compaction a crash cut before its commit: its id is never used
            // again, or the next replay would give that ledger's entries to it.
            m.next_ledger_id = m.next_ledger_id.max(id.saturating_add(1));
        }
        m.active = None;
        let mut ledgers = self.ledgers.write();
        for (&id, l) in ledgers.iter_mut() {
            match l.sealed {
                Some(n) if n != l.count => {
                    return Err(corrupt_record(
                        &self.io,
                        0,
                        Position::new(id, l.count),
                        format!(
                            "managed ledger {:?}: ledger {id} was sealed at {n} entries, only {} survive",
                            self.name, l.count
                        ),
                    ));
                }
                Some(_) => {}
                None => l.sealed = Some(l.count),
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------- queries

    // A thread never takes `ledgers.read()` while it holds it: std's lock,
    // like parking_lot's, queues a new reader behind a waiting writer (the
    // journal thread applying an append), so a nested read waits on itself.

    pub fn first_position(&self) -> Option<Position> {
        first_in(&self.ledgers.read())
    }

    pub fn last_position(&self) -> Option<Position> {
        last_in(&self.ledgers.read())
    }

    /// The first existing entry after `p` (after nothing: the first entry).
    pub fn next_after(&self, p: Option<Position>) -> Option<Position> {
        let (ledger, entry) = match p {
            None => (0, 0),
            Some(p) => match p.entry_id.checked_add(1) {
                Some(e) => (p.ledger_id, e),
                None => (p.ledger_id.checked_add(1)?, 0),
            },
        };
        let ledgers = self.ledgers.read();
        for (&id, l) in ledgers.range(ledger..) {
            let e = if id == ledger { entry } else { 0 };
            if e < l.count {
                return Some(Position::new(id, e));
            }
        }
        None
    }

    pub fn exists(&self, p: Position) -> bool {
        self.ledgers
            .read()
            .get(&p.ledger_id)
            .is_some_and(|l| p.entry_id < l.count)
    }

    /// A position between existing entries that names no entry (in a
    /// trimmed or empty ledger): valid as a mark-delete bound.
    pub fn is_gap(&self, p: Position) -> bool {
        if p.ledger_id < FIRST_LEDGER_ID || p.entry_id > MAX_STORED_ENTRY_ID {
            return false;
        }
        let ledgers = self.ledgers.read();
        !ledgers.contains_key(&p.ledger_id) && last_in(&ledgers).is_some_and(|l| p < l)
    }

    pub fn not_found(&self, p: Position) -> Error {
        let ledgers = self.ledgers.read();
        let reason = match ledgers.get(&p.ledger_id) {
            Some(l) => format!("ledger {} has {} entries", p.ledger_id, l.count),
            None => match (first_in(&ledgers), last_in(&ledgers)) {
                (Some(f), _) if p < f => format!("trimmed (first entry is {f})"),
                (_, Some(l)) if p > l => format!("past the end (last entry is {l})"),
                (_, None) => "the managed ledger is empty".to_owned(),
                _ => format!("ledger {} does not exist", p.ledger_id),
            },
        };
        Error::PositionNotFound {
            position: p,
            reason,
        }
    }

    pub fn entry_count(&self) -> u64 {
        self.ledgers.read().values().map(|l| l.count).sum()
    }

    // ------------------------------------------------------------- reads

    /// Reads entries `[first, first + n)` of ledger `ledger` (all published).
    pub fn read_run(&self, ledger: u64, first: u64, n: u64) -> Result<Vec<Vec<u8>>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        // A checkpoint may retire a journal segment between the plan and
        // the read: the entries are in the ledger files then; plan again.
        for _ in 0..8 {
            let planned = {
                let ledgers = self.ledgers.read();
                match ledgers.get(&ledger) {
                    None => Err(Position::new(ledger, first)),
                    // Checked: `first` may come from a caller (u64::MAX reads nothing).
                    Some(l) if first.checked_add(n).is_none_or(|end| end > l.count) => {
                        Err(Position::new(ledger, first.saturating_add(n - 1)))
                    }
                    Some(l) => {
                        let in_files = l.file_entries.saturating_sub(first).min(n);
                        let from = (first + in_files).saturating_sub(l.file_entries) as usize;
                        let locs: Vec<Loc> = l
                            .tail
                            .range(from..from + (n - in_files) as usize)
                            .copied()
                            .collect();
                        Ok((in_files, locs))
                    }
                }
            };
            // Outside the read guard: `not_found` takes it again.
            let (in_files, locs) = planned.map_err(|p| self.not_found(p))?;
            let mut out = if in_files > 0 {
                let h = self.io.ledger_files(self, ledger, FileOpen::Existing)?;
                let v = h.files(ledger).read(first, in_files)?;
                self.io.file_reads.fetch_add(in_files, Ordering::Relaxed);
                v
            } else {
                Vec::new()
            };
            if locs.is_empty() {
                return Ok(out);
            }
            let p = Position::new(ledger, first + in_files);
            if let Some(v) = self.io.read_journal(self, p, &locs)? {
                out.extend(v);
                return Ok(out);
            }
        }
        Err(Error::io(
            format!("reading managed ledger {:?}", self.name),
            &std::io::Error::other("journal segments kept moving under the read"),
        ))
    }

    pub fn read(&self, p: Position) -> Result<Vec<u8>> {
        self.io.read_fault(&self.name)?;
        let mut v = self.read_run(p.ledger_id, p.entry_id, 1)?;
        v.pop().ok_or_else(|| self.not_found(p))
    }

    /// Reads existing positions (ascending), one read per contiguous run.
    pub fn read_positions(&self, ps: &[Position]) -> Result<Vec<Vec<u8>>> {
        if !ps.is_empty() {
            self.io.read_fault(&self.name)?;
        }
        let mut out = Vec::with_capacity(ps.len());
        let mut i = 0;
        while i < ps.len() {
            let first = ps[i];
            let mut j = i + 1;
            while j < ps.len()
                && ps[j].ledger_id == first.ledger_id
                && ps[j].entry_id == ps[j - 1].entry_id + 1
            {
                j += 1;
            }
            out.extend(self.read_run(first.ledger_id, first.entry_id, (j - i) as u64)?);
            i = j;
        }
        Ok(out)
    }

    pub fn read_range(&self, start: Position, end: Position) -> Result<Vec<(Position, Vec<u8>)>> {
        if start > end {
            return Err(Error::invalid(format!(
                "read_range start {start} is after end {end}"
            )));
        }
        match self.last_position() {
            Some(l) if start <= l => {}
            _ => return Err(self.not_found(start)),
        }
        self.io.read_fault(&self.name)?;
        let runs: Vec<(u64, u64, u64)> = self
            .ledgers
            .read()
            .range(start.ledger_id..=end.ledger_id)
            .filter_map(|(&id, l)| {
                let a = if id == start.ledger_id {
                    start.entry_id
                } else {
                    0
                };
                let b = if id == end.ledger_id {
                    end.entry_id.saturating_add(1).min(l.count)
                } else {
                    l.count
                };
                (a < b).then(|| (id, a, b - a))
            })
            .collect();
        let mut out = Vec::new();
        for (id, a, n) in runs {
            for (k, data) in self.read_run(id, a, n)?.into_iter().enumerate() {
                out.push((Position::new(id, a + k as u64), data));
            }
        }
        Ok(out)
    }

    /// Ledgers wholly before every cursor's mark-delete (never the newest
    /// nor the open one); none without cursors. A hold cursor (name starting
    /// with [`HOLD_CURSOR_PREFIX`]) keeps ledgers like any cursor, but holds
    /// alone trim nothing: some other cursor must have passed a ledger too.
    pub fn trimmable(&self) -> Vec<u64> {
        let m = self.meta.lock();
        let mut min_md: Option<Position> = None;
        {
            let cursors = self.cursors.lock();
            let persisted = m
                .persisted_cursors
                .iter()
                .filter(|(n, _)| !cursors.contains_key(*n))
                .map(|(n, d)| (n.as_str(), d.mark_delete));
            let live = cursors
                .iter()
                .map(|(n, c)| (n.as_str(), c.data.lock().mark_delete));
            let mut any = false;
            for (name, md) in live.chain(persisted) {
                any |= !name.starts_with(HOLD_CURSOR_PREFIX);
                match md {
                    None => return Vec::new(),
                    Some(p) => min_md = Some(min_md.map_or(p, |q: Position| q.min(p))),
                }
            }
            if !any {
                return Vec::new();
            }
        }
        let Some(md) = min_md else {
            return Vec::new();
        };
        let ledgers = self.ledgers.read();
        let newest = ledgers.keys().next_back().copied();
        ledgers
            .iter()
            .filter(|(&id, _)| Some(id) != newest && Some(id) != m.active)
            .filter(|(&id, l)| match l.count {
                0 => id <= md.ledger_id,
                c => Position::new(id, c - 1) <= md,
            })
            .map(|(&id, _)| id)
            .collect()
    }
}

/// The first entry of `ledgers` (under its lock).
fn first_in(ledgers: &BTreeMap<u64, LedgerState>) -> Option<Position> {
    ledgers
        .iter()
        .find(|(_, l)| l.count > 0)
        .map(|(&id, _)| Position::new(id, 0))
}

/// The last entry of `ledgers` (under its lock).
fn last_in(ledgers: &BTreeMap<u64, LedgerState>) -> Option<Position> {
    ledgers
        .iter()
        .rev()
        .find_map(|(&id, l)| (l.count > 0).then(|| Position::new(id, l.count - 1)))
}
