//! Durable ledger storage: managed ledgers over one journal per data
//! directory.
//!
//! A managed ledger is an ordered list of ledgers forming one log (a topic
//! partition, a transaction log, a pending-ack log), plus named cursors.
//! Every managed ledger of a data directory is stored by one [`store`]: one
//! journal with group commit across all of them (one `fdatasync` makes a
//! whole group durable, whichever ledgers it touches), ledger files written
//! behind it, a catalog written at checkpoints. Threads, descriptors and
//! idle memory do not grow with the number of managed ledgers. The layout,
//! the recovery rules and the reasons for them are documented in [`store`]
//! and [`journal`]; the file formats in [`journal`], [`ledger_file`] and
//! [`catalog`].
//!
//! Durability: an append returns (or completes its callback) only once its
//! journal record is synced. After a crash or a power cut recovery keeps
//! every acknowledged entry; damage to acknowledged data is a
//! `CorruptLedger` error naming where, never a silent loss; a torn tail of
//! unacknowledged data is cut.
//!
//! A read-only open takes no lock and writes nothing, so another process
//! (a Spark worker) can read a live directory: it loads the catalog, reads
//! sealed ledger files, and scans the journal tail up to the writer's synced
//! end; [`ManagedLedger::refresh`] catches up.

pub mod catalog;
pub mod compacted;
pub mod cursor;
pub mod fault;
mod flusher;
pub mod fs;
mod group_commit;
pub use group_commit::PositionCallback;
pub mod journal;
pub mod ledger_file;
pub mod options;
mod recovery;
#[cfg(any(test, feature = "testing"))]
pub mod simfs;
mod state;
pub mod store;

pub use compacted::CompactedTopic;
pub use cursor::{Cursor, HOLD_CURSOR_PREFIX};
pub use fault::{FaultInjector, FaultKind};
pub use options::{LedgerOptions, MAX_ENTRY_SIZE};

use crate::error::{Error, Result};
use crate::position::Position;
use crate::sink::{AppendCallback, EntrySink};
use crate::sync::Mutex;
use cursor::CursorInner;
use group_commit::{Command, Done};
use state::MlState;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use store::Store;

/// What a handle and its cursors share.
pub(crate) struct Shared {
    pub ml: Arc<MlState>,
    pub store: Arc<Store>,
    pub closed: AtomicBool,
    pub name: String,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub fn check_open(&self) -> Result<()> {
        self.store.check_live()?;
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::LedgerClosed(self.name.clone()));
        }
        Ok(())
    }

    pub fn check_writable(&self) -> Result<()> {
        self.check_open()?;
        if self.store.io.read_only {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        Ok(())
    }

    pub fn next_after(&self, p: Option<Position>) -> Option<Position> {
        self.ml.next_after(p)
    }

    pub fn exists(&self, p: Position) -> bool {
        self.ml.exists(p)
    }

    pub fn is_gap(&self, p: Position) -> bool {
        self.ml.is_gap(p)
    }

    pub fn not_found(&self, p: Position) -> Error {
        self.ml.not_found(p)
    }

    pub fn first_position(&self) -> Option<Position> {
        self.ml.first_position()
    }

    pub fn read_positions(&self, ps: &[Position]) -> Result<Vec<Vec<u8>>> {
        self.ml.read_positions(ps)
    }

    /// A cursor changed: journal it soon.
    pub fn mark_dirty(&self) {
        self.store.cursor_changed(&self.ml);
    }

    /// Journals cursor states (and trims) now.
    pub fn persist(&self) -> Result<()> {
        self.store.persist_cursors(&self.ml, true)
    }
}

/// A durable, ordered log of entries with cursors; always used as
/// `Arc<ManagedLedger>`.
pub struct ManagedLedger {
    shared: Arc<Shared>,
    /// Serialises `close` (the first one does the work).
    closing: Mutex<()>,
}

impl fmt::Debug for ManagedLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedLedger")
            .field("name", &self.shared.name)
            .field("data_dir", &self.shared.store.io.data_dir)
            .field("read_only", &self.is_read_only())
            .finish()
    }
}

impl ManagedLedger {
    /// Opens (creating if needed) managed ledger `name` under `data_dir`,
    /// recovering the directory if this is its first open in the process.
    pub fn open(data_dir: &Path, name: &str, opts: LedgerOptions) -> Result<Arc<ManagedLedger>> {
        catalog::escape_name(name)?;
        let store = Store::acquire(data_dir, &opts)?;
        let ml = match store.open_ml(name, &opts) {
            Ok(ml) => ml,
            Err(e) => {
                let _ = store.release();
                return Err(e);
            }
        };
        Ok(Arc::new(ManagedLedger {
            shared: Arc::new(Shared {
                ml,
                store,
                closed: AtomicBool::new(false),
                name: name.to_owned(),
            }),
            closing: Mutex::new(()),
        }))
    }

    /// Names of the managed ledgers in `data_dir` (read-only: works on a
    /// live directory from another process, and on a closed one).
    pub fn list(data_dir: &Path) -> Result<Vec<String>> {
        let opts = LedgerOptions {
            read_only: true,
            ..LedgerOptions::default()
        };
        let store = Store::acquire(data_dir, &opts)?;
        let r = store.refresh().map(|()| store.ml_names());
        let _ = store.release();
        r
    }

    /// Picks up what another process wrote since the last look (read-only
    /// opens; a no-op for the writer, whose state is always current).
    pub fn refresh(&self) -> Result<()> {
        self.shared.check_open()?;
        if !self.is_read_only() {
            return Ok(());
        }
        self.shared.store.refresh()?;
        // Open cursors take the persisted state; their read position stays.
        let m = self.shared.ml.meta.lock();
        for (name, c) in self.shared.ml.cursors.lock().iter() {
            let mut d = c.data.lock();
            let read_after = d.read_after;
            *d = m.persisted_cursors.get(name).cloned().unwrap_or_default();
            d.read_after = read_after.max(d.mark_delete);
        }
        Ok(())
    }

    /// Name of the managed ledger.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The path prefix of its ledger files: `<prefix>@<id>.log`/`.idx`.
    pub fn file_prefix(&self) -> &Path {
        &self.shared.ml.prefix
    }

    /// The data directory it lives in.
    pub fn data_dir(&self) -> &Path {
        &self.shared.store.io.data_dir
    }

    /// True if opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.shared.store.io.read_only
    }

    /// True once closed.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// The data directory's fault injector (test hook).
    pub fn fault_injector(&self) -> &Arc<FaultInjector> {
        &self.shared.store.io.faults
    }

    /// Arms a fault: the next `times` calls of `kind` fail with `errno`.
    pub fn inject_fault(&self, kind: FaultKind, errno: i32, times: u32) {
        self.shared.store.io.faults.inject(kind, errno, times);
    }

    /// Counters of the data directory's storage (syncs, bytes, checkpoints…).
    pub fn storage_stats(&self) -> Vec<(&'static str, u64)> {
        self.shared.store.stats()
    }

    /// The last background storage failure (retried meanwhile), if any.
    pub fn storage_error(&self) -> Option<String> {
        self.shared.store.last_error()
    }

    /// Makes everything written so far durable in ledger files and the
    /// catalog now (normally the flusher does so periodically).
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.check_open()?;
        self.shared.store.checkpoint_now()
    }

    fn check_entry(&self, data: &[u8]) -> Result<()> {
        self.shared.check_writable()?;
        if data.len() > MAX_ENTRY_SIZE {
            return Err(Error::invalid(format!(
                "entry of {} bytes exceeds the maximum of {MAX_ENTRY_SIZE}",
                data.len()
            )));
        }
        Ok(())
    }

    fn append_cmd(&self, entries: Vec<Vec<u8>>, done: Done) -> Command {
        let bytes = entries.iter().map(|e| e.len() as u64 + 8).sum();
        Command::Append {
            ml: Arc::clone(&self.shared.ml),
            entries,
            bytes,
            done,
        }
    }

    /// Appends one entry; returns its position once it is durable.
    pub fn append(&self, data: &[u8]) -> Result<Position> {
        self.check_entry(data)?;
        let mut v = self
            .shared
            .store
            .submit_wait(self.append_cmd(vec![data.to_vec()], Done::nothing()))?;
        v.pop()
            .ok_or_else(|| Error::invalid("append completed without a position"))
    }

    /// Appends entries in one group commit (never split across ledgers);
    /// returns their positions once all are durable.
    pub fn append_many(&self, data: Vec<Vec<u8>>) -> Result<Vec<Position>> {
        self.shared.check_writable()?;
        for d in &data {
            self.check_entry(d)?;
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        self.shared
            .store
            .submit_wait(self.append_cmd(data, Done::nothing()))
    }

    /// Like [`append_many`](Self::append_many) but returns at once; `done`
    /// runs on a storage thread once all entries are durable or failed.
    pub fn append_many_async(
        &self,
        data: Vec<Vec<u8>>,
        done: Box<dyn FnOnce(Result<Vec<Position>>) + Send>,
    ) {
        if let Err(e) = self
            .shared
            .check_writable()
            .and_then(|()| data.iter().try_for_each(|d| self.check_entry(d)))
        {
            return done(Err(e));
        }
        if data.is_empty() {
            return done(Ok(Vec::new()));
        }
        let _ = self
            .shared
            .store
            .submit(self.append_cmd(data, Done::batch(done)));
    }

    /// Appends one entry; `at` learns its position as soon as the journal
    /// writer assigns it (before the sync: the entry is not durable, nor
    /// readable, yet), `durable` once it is durable or failed (then `at`,
    /// if not called yet, gets the error too). A transaction's write uses
    /// this: it needs the message id at once and its durability only
    /// before the commit decision.
    pub fn append_positioned(
        &self,
        data: Vec<u8>,
        at: group_commit::PositionCallback,
        durable: AppendCallback,
    ) {
        if let Err(e) = self.check_entry(&data) {
            at(Err(e.clone()));
            return durable(Err(e));
        }
        let _ = self
            .shared
            .store
            .submit(self.append_cmd(vec![data], Done::positioned(at, durable)));
    }

    /// Reads the entry at `pos`.
    pub fn read(&self, pos: Position) -> Result<Vec<u8>> {
        self.shared.check_open()?;
        self.shared.ml.read(pos)
    }

    /// Reads existing entries with `start <= position <= end_inclusive`.
    /// `start` past the last entry is `PositionNotFound`; `end` is clipped.
    pub fn read_range(
        &self,
        start: Position,
        end_inclusive: Position,
    ) -> Result<Vec<(Position, Vec<u8>)>> {
        self.shared.check_open()?;
        self.shared.ml.read_range(start, end_inclusive)
    }

    /// The first existing entry after `p` (after nothing: the first one).
    pub fn next_after(&self, p: Option<Position>) -> Option<Position> {
        self.shared.ml.next_after(p)
    }

    /// First readable entry.
    pub fn first_position(&self) -> Option<Position> {
        self.shared.ml.first_position()
    }

    /// Last durable entry.
    pub fn last_position(&self) -> Option<Position> {
        self.shared.ml.last_position()
    }

    /// Number of readable entries.
    pub fn entry_count(&self) -> u64 {
        self.shared.ml.entry_count()
    }

    /// Ledgers as `(ledger_id, entries, sealed)`.
    pub fn ledgers(&self) -> Vec<(u64, u64, bool)> {
        let active = self.shared.ml.meta.lock().active;
        self.shared
            .ml
            .ledgers
            .read()
            .iter()
            .map(|(&id, l)| (id, l.count, Some(id) != active && l.sealed.is_some()))
            .collect()
    }

    /// Names of the cursors (opened or persisted).
    pub fn cursor_names(&self) -> Vec<String> {
        let m = self.shared.ml.meta.lock();
        let mut names: Vec<String> = m.persisted_cursors.keys().cloned().collect();
        names.extend(self.shared.ml.cursors.lock().keys().cloned());
        names.sort();
        names.dedup();
        names
    }

    /// Opens cursor `name`, restoring its persisted state; a new cursor
    /// starts before the first entry and is made durable at once.
    pub fn open_cursor(&self, name: &str) -> Result<Cursor> {
        self.shared.check_open()?;
        if name.is_empty() {
            return Err(Error::invalid("cursor name must not be empty"));
        }
        // Lock order everywhere: `meta` before `cursors`; never held across
        // a journal write (publishing takes `meta`).
        let ml = &self.shared.ml;
        let existing = ml.cursors.lock().get(name).cloned();
        if let Some(c) = existing {
            return Ok(Cursor {
                inner: c,
                shared: Arc::clone(&self.shared),
            });
        }
        let persisted = ml.meta.lock().persisted_cursors.get(name).cloned();
        let new = persisted.is_none();
        let inner = Arc::new(CursorInner {
            name: name.to_owned(),
            data: Mutex::new(persisted.unwrap_or_default()),
            reading: Mutex::new(()),
            rewinds: std::sync::atomic::AtomicU64::new(0),
        });
        if new && !self.is_read_only() {
            self.shared.store.create_cursor(ml, &inner)?;
        }
        let mut m = ml.meta.lock();
        let mut cursors = ml.cursors.lock();
        let inner = Arc::clone(cursors.entry(name.to_owned()).or_insert(inner));
        m.persisted_cursors.remove(name);
        Ok(Cursor {
            inner,
            shared: Arc::clone(&self.shared),
        })
    }

    /// Removes cursor `name` (it no longer holds back trimming).
    pub fn delete_cursor(&self, name: &str) -> Result<()> {
        self.shared.check_writable()?;
        let ml = &self.shared.ml;
        let known = {
            let m = ml.meta.lock();
            m.persisted_cursors.contains_key(name) || ml.cursors.lock().contains_key(name)
        };
        if !known {
            return Err(Error::invalid(format!("no cursor named {name:?}")));
        }
        // No cursor state may be encoded and journaled across the deletion.
        let _order = ml.cursor_journal.lock();
        // Applying the durable deletion record forgets the cursor (state.rs):
        // a second removal here could drop one a concurrent open made since.
        self.shared.store.delete_cursor(ml, name)?;
        // It may have been the slowest: the flusher looks at trimming again.
        self.shared.store.cursor_changed(ml);
        Ok(())
    }

    /// Journals cursor states now and trims passed ledgers (their files
    /// are removed before this returns).
    pub fn flush(&self) -> Result<()> {
        self.shared.check_writable()?;
        self.shared.persist()?;
        if self.shared.store.has_pending_deletes() {
            self.shared.store.checkpoint_now()?;
        }
        Ok(())
    }

    /// Atomically replaces the whole log with one new ledger holding
    /// `entries` (compaction). Returns their positions.
    pub fn replace_all(&self, entries: Vec<Vec<u8>>) -> Result<Vec<Position>> {
        self.shared.check_writable()?;
        for d in &entries {
            self.check_entry(d)?;
        }
        let bytes = entries.iter().map(|e| e.len() as u64 + 8).sum();
        self.shared.store.submit_wait(Command::Replace {
            ml: Arc::clone(&self.shared.ml),
            entries,
            bytes,
            done: Done::nothing(),
        })
    }

    /// Marks the ledger as a compacted topic.
    pub fn set_compacted(&self) -> Result<()> {
        self.shared.check_writable()?;
        if self.is_compacted() {
            return Ok(());
        }
        self.shared.store.set_compacted(&self.shared.ml)
    }

    /// True if this is a compacted topic.
    pub fn is_compacted(&self) -> bool {
        self.shared.ml.meta.lock().compacted
    }

    /// Seals the open ledger, journals cursor states and releases the data
    /// directory (the last handle closes it: checkpoint, threads stopped,
    /// lock released). Later calls return `Ok`; other calls fail with
    /// `LedgerClosed`.
    ///
    /// Returns within the directory's `close_timeout` whatever the disk
    /// does: past it (a sync that does not return) it fails with an `Io`
    /// error of errno `ETIMEDOUT` naming what it waited for. The handle is
    /// closed all the same; the store's shutdown goes on in the background
    /// (an open of the directory in this process waits for it, with its own
    /// deadline), and the next open recovers from the files whatever it
    /// did not finish (entries acknowledged were durable already; cursor
    /// states not made durable are redelivered from the last durable ones).
    pub fn close(&self) -> Result<()> {
        let _g = self.closing.lock();
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if self.shared.store.check_live().is_err() {
            // Opened before fork(): nothing of the parent's runs here.
            return Ok(());
        }
        let deadline = Instant::now() + self.shared.store.opts.close_timeout;
        let r = self.shared.store.close_ml(&self.shared.ml, deadline);
        let r2 = self.shared.store.release_by(deadline);
        r.and(r2)
    }
}

impl ManagedLedger {
    /// Removes this managed ledger with all its entries and cursors, and
    /// closes the handle. Its files are removed by the next checkpoint.
    pub fn delete(&self) -> Result<()> {
        self.shared.check_writable()?;
        let _g = self.closing.lock();
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return Err(Error::LedgerClosed(self.shared.name.clone()));
        }
        let r = self.shared.store.delete_ml(&self.shared.ml);
        let r2 = self.shared.store.release();
        r.and(r2)
    }
}

impl Drop for ManagedLedger {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl EntrySink for ManagedLedger {
    fn append_async(&self, entry: Vec<u8>, done: AppendCallback) {
        if let Err(e) = self.check_entry(&entry) {
            return done(Err(e));
        }
        let _ = self
            .shared
            .store
            .submit(self.append_cmd(vec![entry], Done::callback(done)));
    }

    fn has_room(&self, bytes: usize) -> bool {
        self.shared.store.has_room(bytes as u64)
    }

    fn name(&self) -> &str {
        &self.shared.name
    }
}
