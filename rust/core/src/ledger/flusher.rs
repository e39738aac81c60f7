//! The flusher of a data directory's store: one thread that writes
//! published entries behind the journal into ledger files (in batches, so
//! that each file write carries many entries whatever the number of
//! ledgers), journals dirty cursor states and trims, and checkpoints: syncs
//! the ledger files and directories written since the last checkpoint (one
//! `syncfs` past [`SYNCFS_THRESHOLD`] of them), writes the CATALOG (whose
//! checkpoint is the journal offset before which everything is now in files
//! or in the catalog), and removes journal segments and ledger files no
//! longer needed. Also [`Signals`]: what the journal's threads tell it.

use super::catalog::{write_catalog, CATALOG_FILE, CATALOG_FORMAT_VERSION};
use super::fault::FaultKind;
use super::fs::FsFile;
use super::group_commit::Published;
use super::journal::{self, Kind};
use super::ledger_file::{self, NewRecord};
use super::state::{Applied, FileOpen, MlState, CREATED};
use super::store::*;
use crate::error::{Error, Result};
use crate::position::Position;
use crate::proto::{Catalog, ManagedLedgerState};
use crate::sync::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet, HashSet};

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the journal's threads tell the store (no reference back to it).
#[derive(Debug, Default)]
pub(crate) struct Signals {
    pub(super) flush: Mutex<FlushState>,
    pub(super) flush_cv: Condvar,
    pub(super) pending: Mutex<u64>,
    pub(super) pending_cv: Condvar,
}

#[derive(Debug, Default)]
pub(super) struct FlushState {
    pub(super) stop: bool,
    /// Managed ledgers with entries still only in the journal.
    pub(super) dirty: HashSet<u64>,
    /// Ledger files to remove once a catalog without them is durable.
    pub(super) deletes: Vec<(Arc<MlState>, u64)>,
    /// A cursor changed somewhere (journal its state soon).
    pub(super) cursors: bool,
    /// Someone waits for a checkpoint (sequence it must pass).
    pub(super) checkpoint_wanted: bool,
}

impl Published for Signals {
    fn published(&self, _end: u64, applied: Vec<(Arc<MlState>, Applied)>) {
        let mut f = self.flush.lock();
        let mut wake = false;
        for (ml, a) in applied {
            if a.appended && f.dirty.insert(ml.id) {
                wake = true;
            }
            if !a.dropped.is_empty() {
                let mut cache = ml.io.files.lock();
                for id in a.dropped {
                    cache.evict((ml.id, id));
                    f.deletes.push((Arc::clone(&ml), id));
                }
            }
        }
        if wake {
            self.flush_cv.notify_one();
        }
    }

    fn released(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut p = self.pending.lock();
        *p = p.saturating_sub(bytes);
        self.pending_cv.notify_all();
    }
}

/// The flusher writes published entries behind into ledger files once this
/// many journal bytes are waiting, or this long after the last time.
const WRITE_BEHIND_BYTES: u64 = 8 << 20;
const WRITE_BEHIND_EVERY: Duration = Duration::from_millis(200);

/// Past this many files and directories to sync, a checkpoint syncs the
/// whole file system with one call instead.
const SYNCFS_THRESHOLD: usize = 64;

/// Write-behind work for one ledger: first entry id, the entries' bodies
/// back to back, and each one's (length, checksum, `.log` offset if it is
/// already there: a large entry the journal writer wrote directly).
type Batch = (u64, Vec<u8>, Vec<(u32, u32, Option<u64>)>);

impl Store {
    pub(super) fn flusher_loop(&self) {
        let tick = self
            .opts
            .cursor_flush_interval
            .max(Duration::from_millis(1));
        let mut last_cursor_flush = Instant::now();
        let mut last_copy = Instant::now();
        loop {
            let (stop, cursors, dirty, want_ckpt) = {
                let mut f = self.signals.flush.lock();
                let wait = if f.cursors {
                    tick
                } else {
                    WRITE_BEHIND_EVERY.min(tick.max(Duration::from_millis(50)))
                };
                if !f.stop && !f.checkpoint_wanted {
                    self.signals.flush_cv.wait_for(&mut f, wait);
                }
                let cursors = f.cursors && last_cursor_flush.elapsed() >= tick;
                if cursors {
                    f.cursors = false;
                }
                (
                    f.stop,
                    cursors,
                    !f.dirty.is_empty(),
                    std::mem::take(&mut f.checkpoint_wanted),
                )
            };
            if stop {
                return;
            }
            if cursors {
                last_cursor_flush = Instant::now();
                let mls: Vec<Arc<MlState>> = self.mls.read().values().cloned().collect();
                for ml in mls {
                    if ml.cursors_dirty.load(Ordering::Acquire) {
                        let _ = self.persist_cursors(&ml, false);
                    }
                }
            }
            let (due, behind) = {
                let c = self.ckpt.lock();
                let synced = self
                    .journal
                    .as_ref()
                    .map_or(0, |j| j.synced.load(Ordering::Acquire));
                let grown = synced.saturating_sub(c.at);
                let due = grown >= self.opts.checkpoint_bytes
                    || (grown > 0
                        && c.when
                            .is_some_and(|w| w.elapsed() >= self.opts.checkpoint_interval));
                (due, synced.saturating_sub(c.copied))
            };
            // Write-behind in batches: every ledger written then gets many
            // entries per write, whatever the number of ledgers.
            let copy = dirty
                && (behind >= WRITE_BEHIND_BYTES || last_copy.elapsed() >= WRITE_BEHIND_EVERY);
            let r = {
                let _g = self.serial.lock();
                if due || want_ckpt {
                    last_copy = Instant::now();
                    self.checkpoint(false)
                } else if copy {
                    last_copy = Instant::now();
                    self.copy_behind()
                } else {
                    Ok(())
                }
            };
            if let Err(e) = r {
                let mut c = self.ckpt.lock();
                c.errors += 1;
                c.last_error = Some(e.to_string());
                drop(c);
                // Back off; the work is retried.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Writes every published entry still only in the journal into its
    /// ledger's files (no sync: the next checkpoint syncs them).
    fn copy_behind(&self) -> Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let upto = j.synced.load(Ordering::Acquire);
        let dirty: Vec<u64> = std::mem::take(&mut self.signals.flush.lock().dirty)
            .into_iter()
            .collect();
        let from = self.ckpt.lock().copied;
        if from >= upto {
            return Ok(());
        }
        let result = self.copy_range(from, upto);
        match &result {
            Ok(()) => self.ckpt.lock().copied = upto,
            Err(_) => self.signals.flush.lock().dirty.extend(dirty),
        }
        result
    }

    fn copy_range(&self, from: u64, upto: u64) -> Result<()> {
        let mut batches: BTreeMap<(u64, u64), Batch> = BTreeMap::new();
        let mut held = 0usize;
        let segments: Vec<(u64, Arc<dyn FsFile>)> = self
            .io
            .segments
            .read()
            .iter()
            .map(|(b, f)| (*b, Arc::clone(f)))
            .collect();
        let start = segments.iter().rposition(|(b, _)| *b <= from).unwrap_or(0);
        for (base, file) in &segments[start..] {
            if *base >= upto {
                break;
            }
            let path = journal::segment_path(&self.io.data_dir, *base);
            let scan = journal::scan_segment(
                file.as_ref(),
                &path,
                *base,
                from.max(*base),
                Some(upto),
                |seen| {
                    let direct = match seen.head.kind {
                        Kind::Entry => None,
                        Kind::EntryRef => match journal::EntryRef::decode(seen.body) {
                            Some(r) => Some(r),
                            None => {
                                return Err(journal::corrupt(
                                    &path,
                                    seen.at,
                                    seen.head.position(),
                                    "malformed entry reference",
                                ))
                            }
                        },
                        _ => return Ok(()),
                    };
                    let b = batches
                        .entry((seen.head.ml, seen.head.a))
                        .or_insert_with(|| (seen.head.b, Vec::new(), Vec::new()));
                    if b.0 + b.2.len() as u64 != seen.head.b {
                        return Err(journal::corrupt(
                            &path,
                            seen.at,
                            seen.head.position(),
                            "entries out of order in the journal",
                        ));
                    }
                    match direct {
                        Some(r) => b.2.push((r.len, r.crc, Some(r.offset))),
                        None => {
                            b.1.extend_from_slice(seen.body);
                            b.2.push((seen.head.body_len, seen.head.body_crc, None));
                            held += seen.body.len();
                        }
                    }
                    Ok(())
                },
            )?;
            if let Some(d) = scan.damage {
                if d.at < upto {
                    return Err(journal::corrupt(
                        &path,
                        d.at,
                        Position::default(),
                        format!("{} in a synced journal range", d.reason),
                    ));
                }
            }
            if held > 16 << 20 {
                self.write_batches(std::mem::take(&mut batches))?;
                held = 0;
            }
        }
        self.write_batches(batches)
    }

    fn write_batches(&self, batches: BTreeMap<(u64, u64), Batch>) -> Result<()> {
        for ((ml_id, ledger), (first, bodies, lens)) in batches {
            let Some(ml) = self.mls.read().get(&ml_id).cloned() else {
                continue;
            };
            let (skip, file_bytes, fresh) = {
                let ledgers = ml.ledgers.read();
                let Some(l) = ledgers.get(&ledger) else {
                    continue;
                };
                if l.file_entries < first {
                    return Err(Error::invalid(format!(
                        "write-behind of {}:{ledger} would leave a gap ({} in files, next {first})",
                        ml.name, l.file_entries
                    )));
                }
                (
                    (l.file_entries - first) as usize,
                    l.file_bytes,
                    l.file_entries == 0,
                )
            };
            if skip >= lens.len() {
                continue;
            }
            let mut off = 0usize;
            let mut at = file_bytes;
            let mut records: Vec<NewRecord<'_>> = Vec::with_capacity(lens.len());
            for (i, &(len, crc, direct)) in lens.iter().enumerate() {
                let payload = match direct {
                    // Already in the file: it must be exactly where the
                    // records before it end.
                    Some(o) => {
                        if i >= skip && o != at {
                            return Err(ledger_file::corrupt(
                                &ledger_file::log_path(&ml.prefix, ledger),
                                ledger,
                                first + i as u64,
                                o,
                                format!("a directly written entry is at {o}, expected {at}"),
                            ));
                        }
                        None
                    }
                    None => {
                        off += len as usize;
                        Some(&bodies[off - len as usize..off])
                    }
                };
                if i >= skip {
                    at += (ledger_file::RECORD_HEADER_LEN + len as usize) as u64;
                }
                records.push(NewRecord { payload, len, crc });
            }
            let records = &records[skip..];
            if fresh {
                // New names in `ledgers/` (maybe the directory itself): made
                // durable by the checkpoint before a catalog refers to them.
                let ldir = self.io.data_dir.join(LEDGERS_DIR);
                let created = super::fs::make_dirs(self.io.fs.as_ref(), &ldir)?;
                let mut c = self.ckpt.lock();
                c.dirs.insert(ldir);
                if !created.is_empty() {
                    c.dirs.insert(self.io.data_dir.clone());
                }
            }
            let how = if fresh {
                FileOpen::Fresh
            } else {
                FileOpen::Create
            };
            let h = self.io.ledger_files(&ml, ledger, how)?;
            let first_new = first + skip as u64;
            let end = ledger_file::append(&h.files(ledger), first_new, file_bytes, records)?;
            self.ckpt.lock().unsynced.insert((ml_id, ledger));
            let mut ledgers = ml.ledgers.write();
            if let Some(l) = ledgers.get_mut(&ledger) {
                if l.file_entries == first_new {
                    let n = records.len().min(l.tail.len());
                    l.file_entries += n as u64;
                    l.file_bytes = end;
                    l.tail.drain(..n);
                    self.ckpt.lock().copied_entries += n as u64;
                }
            }
        }
        Ok(())
    }

    /// Makes everything published durable in ledger files and the catalog,
    /// then removes what no longer needs to exist. `closing`: the journal
    /// is stopped; remove all of it.
    pub(super) fn checkpoint(&self, closing: bool) -> Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        if let Some(e) = &self.ckpt.lock().sync_failed {
            return Err(e.clone());
        }
        if let Some(e) = j.stopped() {
            return Err(e);
        }
        let at = j.synced.load(Ordering::Acquire);
        let from = self.ckpt.lock().copied;
        if from < at {
            self.copy_range(from, at)?;
            self.ckpt.lock().copied = at;
        }
        let deletes = std::mem::take(&mut self.signals.flush.lock().deletes);
        let (unsynced, dirs) = {
            let mut c = self.ckpt.lock();
            (std::mem::take(&mut c.unsynced), std::mem::take(&mut c.dirs))
        };
        let sync_result = if unsynced.len() + dirs.len() > SYNCFS_THRESHOLD {
            // Thousands of files and directories: one syncfs beats
            // thousands of fsyncs.
            self.io.fs.sync_filesystem(&self.io.data_dir).map_err(|e| {
                io_err(
                    format!("syncing the file system of {}", self.io.data_dir.display()),
                    &e,
                )
            })
        } else {
            self.sync_each(&unsynced, &dirs)
        };
        if let Err(e) = sync_result {
            let mut c = self.ckpt.lock();
            c.unsynced.extend(unsynced);
            c.dirs.extend(dirs);
            // Never retry the sync and trust it (see `sync_failed`).
            c.sync_failed = Some(e.clone());
            drop(c);
            self.signals.flush.lock().deletes.extend(deletes);
            return Err(e);
        }
        let sequence = self.ckpt.lock().sequence + 1;
        // The ledgers first, then the next id: a ledger created in between
        // has an id below the one read (its id is taken before it is listed).
        // The other order listed it with the catalog's next id, which the
        // next open refuses.
        let ledgers = {
            let mls = self.mls.read();
            let mut v: Vec<ManagedLedgerState> = mls
                .values()
                .filter(|ml| !ml.meta.lock().deleted)
                // One whose creation record is not published yet is not
                // listed: that record is past `at` (`synced` moves only
                // after publishing), so the replay from `at` creates it if
                // it became durable; listing it would bring back a
                // creation that failed.
                .filter(|ml| ml.created.load(Ordering::Acquire) == CREATED)
                .map(|ml| ml.snapshot())
                .collect();
            v.sort_by_key(|s| s.id);
            v
        };
        if let Err(e) = self.io.faults.check(FaultKind::Checkpoint) {
            self.signals.flush.lock().deletes.extend(deletes);
            return Err(io_err("taking a checkpoint", &e));
        }
        let cat = Catalog {
            format_version: CATALOG_FORMAT_VERSION,
            checkpoint: at,
            next_ml_id: self.next_ml_id.load(Ordering::Acquire),
            ledgers,
            sequence,
        };
        let written = self
            .io
            .faults
            .check(FaultKind::Meta)
            .map_err(|e| {
                io_err(
                    format!("writing {}", self.io.data_dir.join(CATALOG_FILE).display()),
                    &e,
                )
            })
            .and_then(|()| write_catalog(self.io.fs.as_ref(), &self.io.data_dir, &cat));
        if let Err(e) = written {
            self.signals.flush.lock().deletes.extend(deletes);
            return Err(e);
        }
        {
            let mut c = self.ckpt.lock();
            c.at = at;
            c.sequence = sequence;
            c.when = Some(Instant::now());
            c.count += 1;
        }
        // Journal segments wholly before the checkpoint.
        let bases: Vec<u64> = self.io.segments.read().keys().copied().collect();
        for (i, &b) in bases.iter().enumerate() {
            let next = bases.get(i + 1).copied();
            let gone = match next {
                Some(n) => n <= at,
                None => closing,
            };
            if gone {
                self.io.segments.write().remove(&b);
                let p = journal::segment_path(&self.io.data_dir, b);
                let _ = self.io.fs.remove_file(&p);
            }
        }
        // Ledger files no catalog lists any more (a failure leaves a
        // leftover that the next open removes). The names' floors
        // (`Store::retired`) stay for the store's session: these unlinks are
        // not synced, so a power cut may bring the files back, and a name
        // created again must never reuse their ids (one map entry per name
        // deleted in the session).
        for (ml, id) in deletes {
            self.io.files.lock().evict((ml.id, id));
            let _ = self
                .io
                .fs
                .remove_file(&ledger_file::log_path(&ml.prefix, id));
            let _ = self
                .io
                .fs
                .remove_file(&ledger_file::idx_path(&ml.prefix, id));
        }
        Ok(())
    }

    /// True if ledger files wait for a checkpoint to be removed.
    pub fn has_pending_deletes(&self) -> bool {
        !self.signals.flush.lock().deletes.is_empty()
    }

    /// Syncs the given ledger files, then the given directories.
    fn sync_each(&self, files: &HashSet<(u64, u64)>, dirs: &BTreeSet<PathBuf>) -> Result<()> {
        for &(ml_id, ledger) in files {
            let Some(ml) = self.mls.read().get(&ml_id).cloned() else {
                continue;
            };
            if !ml.ledgers.read().contains_key(&ledger) {
                continue;
            }
            let h = self.io.ledger_files(&ml, ledger, FileOpen::Existing)?;
            h.log
                .sync_data()
                .and_then(|()| h.idx.sync_data())
                .map_err(|e| io_err(format!("syncing {}", h.log_path.display()), &e))?;
        }
        for d in dirs {
            self.io
                .fs
                .sync_dir(d)
                .map_err(|e| io_err(format!("syncing {}", d.display()), &e))?;
        }
        Ok(())
    }

    /// Runs a checkpoint now (and waits for it).
    pub fn checkpoint_now(&self) -> Result<()> {
        self.check_live()?;
        if self.io.read_only {
            return Ok(());
        }
        self.barrier()?;
        // Done on the caller's thread, serialised with the flusher's.
        let _g = self.serial.lock();
        self.checkpoint(false)
    }
}
