//! Recovery of a data directory's store: load the CATALOG, replay the
//! journal from its checkpoint through [`MlState::apply`], and decide what
//! damage means with the acknowledged-point rule of [`super::journal`]
//! (read-write: cut a torn tail, durably; read-only: stop at it). A
//! read-only store refreshes the same way, building a new checkpoint's
//! state on the side and swapping it in.

use super::catalog::{self, read_catalog, CATALOG_FILE};
use super::flusher::Signals;
use super::fs::{Fs, FsFile, OpenMode};
use super::journal::{self, Kind, JOURNAL_DIR};
use super::state::{FileCache, MlState, StoreIo};
use super::store::*;
use crate::error::{Error, Result};
use crate::position::Position;
use crate::proto::Catalog;
use crate::sync::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Journal segments in `data_dir`, by base offset.
pub(super) fn list_segments(fs: &dyn Fs, data_dir: &Path) -> Result<Vec<u64>> {
    let dir = data_dir.join(JOURNAL_DIR);
    let names = match fs.read_dir(&dir) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(format!("listing {}", dir.display()), &e)),
    };
    let mut out: Vec<u64> = names
        .iter()
        .filter_map(|n| n.to_str().and_then(journal::parse_segment_name))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// A journal segment: base offset and open file.
pub(super) type Segment = (u64, Arc<dyn FsFile>);

/// What a journal scan from the checkpoint found.
pub(super) struct TailScan {
    /// Journal offset just past the last valid record.
    pub(super) end: u64,
    /// The segment holding `end` (if any segment exists).
    pub(super) last: Option<Segment>,
}

impl Store {
    /// Loads a catalog into fresh managed-ledger states.
    pub(super) fn load_catalog(&self, cat: &Catalog) -> Result<()> {
        let mut mls = self.mls.write();
        let mut names = self.names.lock();
        let existing: HashMap<u64, Arc<MlState>> = mls.drain().collect();
        names.clear();
        for s in &cat.ledgers {
            let ml = match existing.get(&s.id) {
                Some(ml) if ml.name == s.name => Arc::clone(ml),
                _ => Arc::new(MlState::new(
                    s.id,
                    s.name.clone(),
                    catalog::ledger_prefix(&self.io.data_dir, &s.name)?,
                    Arc::clone(&self.io),
                    Self::rollover_default(&self.opts),
                )),
            };
            ml.load(s)?;
            if names.insert(s.name.clone(), s.id).is_some() || s.id >= cat.next_ml_id {
                return Err(Error::CorruptLedger {
                    path: self.io.data_dir.join(CATALOG_FILE).display().to_string(),
                    position: Position::default(),
                    offset: 0,
                    reason: format!(
                        "managed ledger {:?} listed twice or with a bad id {}",
                        s.name, s.id
                    ),
                });
            }
            mls.insert(s.id, ml);
        }
        // Managed ledgers gone from the catalog (deleted): mark their states.
        for (id, ml) in existing {
            if !mls.contains_key(&id) {
                ml.meta.lock().deleted = true;
                ml.ledgers.write().clear();
            }
        }
        self.next_ml_id.store(cat.next_ml_id, Ordering::Release);
        Ok(())
    }

    /// Why the ledger-file record an `EntryRef` points to does not check
    /// out, if it does not (a group cut short by a crash wrote the reference
    /// but not all of the record: a torn tail; before the acknowledged point,
    /// damage). Entries already in the catalog's count, and entries of
    /// ledgers trimmed since, are not read.
    fn check_entry_ref(&self, seen: &journal::Seen<'_>) -> Result<Option<String>> {
        let h = &seen.head;
        let Some(r) = journal::EntryRef::decode(seen.body) else {
            return Ok(Some("malformed entry reference".to_owned()));
        };
        let Some(ml) = self.mls.read().get(&h.ml).cloned() else {
            return Ok(None);
        };
        // A ledger gone from the state (trimmed: its files may be gone too)
        // skips the record; one whose files hold the entry already trusts it.
        if ml
            .ledgers
            .read()
            .get(&h.a)
            .is_none_or(|l| h.b < l.file_entries)
        {
            return Ok(None);
        }
        let path = super::ledger_file::log_path(&ml.prefix, h.a);
        let f = match self.io.fs.open(&path, OpenMode::READ) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Some(format!("{} is missing", path.display())));
            }
            Err(e) => return Err(Error::io(format!("opening {}", path.display()), &e)),
        };
        let mut buf = vec![0u8; 8 + r.len as usize];
        match f.read_exact_at(&mut buf, r.offset) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Ok(Some(format!(
                    "{} ends before the entry's record",
                    path.display()
                )));
            }
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), &e)),
        }
        let ok = journal::le_u32(&buf) == r.len
            && journal::le_u32(&buf[4..]) == r.crc
            && journal::body_crc(&buf[8..]) == r.crc;
        Ok((!ok).then(|| {
            format!(
                "the record of entry {}:{} at {} in {} does not check out",
                h.a,
                h.b,
                r.offset,
                path.display()
            )
        }))
    }

    /// Applies one journal record during recovery or a read-only scan.
    fn replay_record(&self, seen: &journal::Seen<'_>) -> Result<Vec<(Arc<MlState>, u64)>> {
        let h = &seen.head;
        let bad = |reason: String| Error::CorruptLedger {
            path: journal::segment_path(&self.io.data_dir, 0)
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            position: h.position(),
            offset: seen.at,
            reason,
        };
        match h.kind {
            Kind::MlCreate => {
                let (name, first) = journal::decode_ml_create(seen.body)
                    .ok_or_else(|| bad("malformed managed ledger creation".to_owned()))?;
                let name = name.to_owned();
                if first.is_some_and(|f| f == 0 || f == u64::MAX) {
                    return Err(bad(format!(
                        "managed ledger {name:?} created with a bad first ledger id {first:?}"
                    )));
                }
                // The catalog refuses u64::MAX (no next id after it): so does this.
                let Some(next_id) = h.ml.checked_add(1) else {
                    return Err(bad(format!(
                        "managed ledger {name:?} has a bad id {}",
                        h.ml
                    )));
                };
                let mut mls = self.mls.write();
                if mls.contains_key(&h.ml) {
                    return Ok(Vec::new());
                }
                let mut names = self.names.lock();
                if let Some(old) = names.get(&name) {
                    return Err(bad(format!(
                        "managed ledger {name:?} created twice (ids {old} and {})",
                        h.ml
                    )));
                }
                let ml = Arc::new(MlState::new(
                    h.ml,
                    name.clone(),
                    catalog::ledger_prefix(&self.io.data_dir, &name)?,
                    Arc::clone(&self.io),
                    Self::rollover_default(&self.opts),
                ));
                if let Some(first) = first {
                    ml.meta.lock().next_ledger_id = first;
                }
                names.insert(name, h.ml);
                mls.insert(h.ml, ml);
                self.next_ml_id.fetch_max(next_id, Ordering::AcqRel);
                Ok(Vec::new())
            }
            Kind::MlDelete => {
                // Its `a` is the next ledger id of the name (the floor of its
                // next creation): the catalog refuses u64::MAX, so does this.
                if h.a == u64::MAX {
                    return Err(bad(format!(
                        "managed ledger {} deleted with a bad next ledger id {}",
                        h.ml, h.a
                    )));
                }
                let ml = self.mls.write().remove(&h.ml);
                let Some(ml) = ml else { return Ok(Vec::new()) };
                self.names.lock().remove(&ml.name);
                let next = {
                    let mut m = ml.meta.lock();
                    m.deleted = true;
                    m.next_ledger_id = m.next_ledger_id.max(h.a);
                    m.next_ledger_id
                };
                if !self.io.read_only {
                    // Its files go with the first checkpoint; the name's next
                    // creation starts past them (see `Store::retired`).
                    self.retire(&ml.name, next);
                }
                let ids: Vec<u64> = std::mem::take(&mut *ml.ledgers.write())
                    .into_keys()
                    .collect();
                Ok(ids.into_iter().map(|id| (Arc::clone(&ml), id)).collect())
            }
            _ => {
                let ml = self.mls.read().get(&h.ml).cloned();
                let Some(ml) = ml else {
                    if h.ml < self.next_ml_id.load(Ordering::Acquire) {
                        return Ok(Vec::new()); // deleted since
                    }
                    return Err(bad(format!(
                        "record of managed ledger id {} that was never created",
                        h.ml
                    )));
                };
                let a = ml.apply(seen.at, h, seen.body)?;
                Ok(a.dropped
                    .into_iter()
                    .map(|id| (Arc::clone(&ml), id))
                    .collect())
            }
        }
    }

    /// Replays the journal from `from` (read-write: cutting a torn tail;
    /// read-only: up to `limit`). Returns where it ended.
    pub(super) fn replay_journal(
        &self,
        from: u64,
        limit: Option<u64>,
        repair: bool,
    ) -> Result<TailScan> {
        let fs = &self.io.fs;
        let data = &self.io.data_dir;
        let bases = list_segments(fs.as_ref(), data)?;
        // The segment holding `from`, and every one after it.
        let start = bases.iter().rposition(|&b| b <= from);
        let todo: Vec<u64> = match start {
            Some(i) => bases[i..].to_vec(),
            None => bases.clone(),
        };
        if repair {
            // Segments wholly before the checkpoint are leftovers of a
            // checkpoint that did not finish removing them.
            for &b in bases.iter().take(start.unwrap_or(0)) {
                let p = journal::segment_path(data, b);
                fs.remove_file(&p)
                    .map_err(|e| io_err(format!("removing {}", p.display()), &e))?;
            }
        }
        let mut end = from;
        let mut last: Option<Segment> = None;
        let mut dropped = Vec::new();
        // Where the valid journal stops early: (damage, index in `todo` of
        // the first segment wholly after it, the damaged segment to cut).
        let mut damage: Option<(journal::Damage, usize, Option<Segment>)> = None;
        let mode = if repair {
            OpenMode::WRITE
        } else {
            OpenMode::READ
        };
        for (i, &base) in todo.iter().enumerate() {
            if limit.is_some_and(|l| base >= l) {
                break;
            }
            if base > end {
                let reason = format!("journal records {end}..{base} are missing");
                damage = Some((
                    journal::Damage {
                        at: end,
                        reason,
                        head: None,
                    },
                    i,
                    None,
                ));
                break;
            }
            let path = journal::segment_path(data, base);
            let file = fs
                .open(&path, mode)
                .map_err(|e| io_err(format!("opening journal file {}", path.display()), &e))?;
            if let Err(e) = journal::check_segment_header(file.as_ref(), &path, base) {
                // A segment whose creation a crash cut short.
                let d = journal::Damage {
                    at: base,
                    reason: e.to_string(),
                    head: None,
                };
                damage = Some((d, i + 1, None));
                // It goes with the torn tail (nothing was ever written to it).
                if repair {
                    fs.remove_file(&path)
                        .map_err(|e| io_err(format!("removing {}", path.display()), &e))?;
                }
                break;
            }
            let scan = journal::scan_segment_checked(
                file.as_ref(),
                &path,
                base,
                end.max(base),
                limit,
                |seen| {
                    // A reference is only as good as the ledger-file record
                    // it points to (written in the same group).
                    if seen.head.kind == Kind::EntryRef {
                        if let Some(reason) = self.check_entry_ref(&seen)? {
                            return Ok(Some(reason));
                        }
                    }
                    dropped.extend(self.replay_record(&seen)?);
                    Ok(None)
                },
            )?;
            end = scan.end;
            self.io.segments.write().insert(base, Arc::clone(&file));
            last = Some((base, Arc::clone(&file)));
            if let Some(d) = scan.damage {
                damage = Some((d, i + 1, Some((base, file))));
                break;
            }
        }
        if let Some((d, after, cut)) = damage {
            // The durable point: the largest lac of any valid record after
            // the damage, or the synced hint.
            let hint = fs
                .read_file(&journal::synced_path(data))
                .ok()
                .and_then(|b| journal::decode_synced(&b));
            let mut durable = hint.unwrap_or(0);
            if let Some((b, f)) = &cut {
                let p = journal::segment_path(data, *b);
                durable = durable.max(journal::max_lac_after(f.as_ref(), &p, *b, d.at)?);
            }
            for &later in &todo[after..] {
                let p = journal::segment_path(data, later);
                let Ok(f) = fs.open(&p, OpenMode::READ) else {
                    continue;
                };
                if journal::check_segment_header(f.as_ref(), &p, later).is_err() {
                    continue;
                }
                let s = journal::scan_segment(f.as_ref(), &p, later, later, None, |_| Ok(()))?;
                durable = durable.max(s.max_lac);
                if let Some(dd) = s.damage {
                    durable = durable.max(journal::max_lac_after(f.as_ref(), &p, later, dd.at)?);
                }
            }
            let (path, offset) = match &cut {
                Some((b, _)) => (
                    journal::segment_path(data, *b),
                    journal::SEGMENT_HEADER_LEN + (d.at - b),
                ),
                None => (data.join(JOURNAL_DIR), d.at),
            };
            if d.at < durable {
                let position = d.head.map(|h| h.position()).unwrap_or_default();
                return Err(journal::corrupt(
                    &path,
                    offset,
                    position,
                    format!(
                        "{} at journal offset {}, before the acknowledged point {durable}{}",
                        d.reason,
                        d.at,
                        d.head
                            .map(|h| format!(" (managed ledger id {}, {:?} record)", h.ml, h.kind))
                            .unwrap_or_default()
                    ),
                ));
            }
            if !repair {
                // A reader stops at the damage: the writer may be mid-write.
                return Ok(TailScan { end, last });
            }
            // A torn tail: nothing acknowledged is there. Cut it (durably)
            // and drop every later segment.
            if let Some((_, f)) = &cut {
                f.set_len(offset)
                    .and_then(|()| f.sync_data())
                    .map_err(|e| {
                        io_err(format!("cutting the torn tail of {}", path.display()), &e)
                    })?;
            }
            for &later in &todo[after..] {
                let p = journal::segment_path(data, later);
                match fs.remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(format!("removing {}", p.display()), &e)),
                }
            }
            let jdir = data.join(JOURNAL_DIR);
            fs.sync_dir(&jdir)
                .map_err(|e| io_err(format!("syncing {}", jdir.display()), &e))?;
        }
        if repair {
            self.signals.flush.lock().deletes.extend(dropped);
        }
        Ok(TailScan { end, last })
    }

    /// Read-only stores: picks up what the writer made durable since.
    pub fn refresh(&self) -> Result<()> {
        if !self.io.read_only {
            return Ok(());
        }
        let mut last_err = None;
        for _ in 0..40 {
            match self.refresh_once() {
                Ok(()) => return Ok(()),
                // A checkpoint may remove a segment between our catalog read
                // and its open. (Below the synced hint every record is
                // complete: damage there is real, reported at once.)
                Err(
                    e @ Error::Io {
                        errno: Some(libc::ENOENT),
                        ..
                    },
                ) => last_err = Some(e),
                Err(e) => return Err(e),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(last_err.unwrap_or_else(|| Error::invalid("refresh failed")))
    }

    fn refresh_once(&self) -> Result<()> {
        let fs = &self.io.fs;
        let data = &self.io.data_dir;
        let mut ro = self.ro.lock();
        let cat = match read_catalog(fs.as_ref(), data)? {
            Some(c) => c,
            None => {
                return Err(Error::Io {
                    context: format!("opening data directory {} read-only", data.display()),
                    errno: Some(libc::ENOENT),
                    message: format!("no {CATALOG_FILE} in {}", data.display()),
                })
            }
        };
        let hint = fs
            .read_file(&journal::synced_path(data))
            .ok()
            .and_then(|b| journal::decode_synced(&b));
        let writer_alive = fs.is_locked(&data.join(LOCK_FILE)).unwrap_or(true);
        let limit = match hint {
            Some(h) => Some(h),
            // No live writer: everything valid is what recovery would keep.
            None if !writer_alive => None,
            None => {
                return Err(Error::Io {
                    context: format!("reading {}", journal::synced_path(data).display()),
                    errno: Some(libc::EAGAIN),
                    message: "the journal's synced-end hint is unreadable while a writer runs"
                        .to_owned(),
                })
            }
        };
        let (scanned, seq) = *ro;
        if cat.sequence == seq && scanned != 0 && scanned >= cat.checkpoint {
            let tail = self.replay_journal(scanned, limit, false)?;
            *ro = (tail.end, seq);
            return Ok(());
        }
        // A new checkpoint: load it and its journal tail on the side, then
        // swap each managed ledger's state in at once, so that a reader
        // never sees a log shorter than before (and old journal segments,
        // now in ledger files, are let go).
        let shadow_io = Arc::new(StoreIo {
            fs: Arc::clone(&self.io.fs),
            data_dir: self.io.data_dir.clone(),
            read_only: true,
            faults: Arc::clone(&self.io.faults),
            segments: RwLock::new(BTreeMap::new()),
            files: Mutex::new(FileCache::new(1)),
            file_reads: AtomicU64::new(0),
            journal_reads: AtomicU64::new(0),
        });
        let shadow = Self::bare(
            shadow_io,
            &self.opts,
            self.key.clone(),
            None,
            Arc::new(Signals::default()),
        );
        shadow.load_catalog(&cat)?;
        let tail = shadow.replay_journal(cat.checkpoint, limit, false)?;
        self.adopt(&shadow);
        *ro = (tail.end.max(cat.checkpoint), cat.sequence);
        Ok(())
    }

    /// Takes over the managed-ledger states and journal segments of
    /// `shadow` (a read-only reload), keeping the `MlState`s handles hold.
    fn adopt(&self, shadow: &Store) {
        let smls = shadow.mls.read();
        let mut mls = self.mls.write();
        let mut next: HashMap<u64, Arc<MlState>> = HashMap::new();
        for (&id, s) in smls.iter() {
            let live = match mls.get(&id) {
                Some(m) if m.name == s.name => Arc::clone(m),
                _ => Arc::new(MlState::new(
                    id,
                    s.name.clone(),
                    s.prefix.clone(),
                    Arc::clone(&self.io),
                    Self::rollover_default(&self.opts),
                )),
            };
            live.adopt(s);
            next.insert(id, live);
        }
        // Segments first: the new states point into them.
        *self.io.segments.write() = std::mem::take(&mut *shadow.io.segments.write());
        for (id, m) in mls.drain() {
            if !next.contains_key(&id) {
                m.meta.lock().deleted = true;
                m.ledgers.write().clear();
            }
        }
        *mls = next;
        *self.names.lock() = shadow.names.lock().clone();
        self.next_ml_id
            .store(shadow.next_ml_id.load(Ordering::Acquire), Ordering::Release);
    }
}
