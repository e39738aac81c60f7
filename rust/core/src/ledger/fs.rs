//! The file-system seam of the storage layer.
//!
//! Every byte the storage layer reads or writes, every sync, every created,
//! renamed or removed name goes through [`Fs`] and [`FsFile`]. Production
//! uses [`RealFs`] (plain POSIX calls); the power-cut tests use
//! `SimFs` (cargo feature `testing`), which remembers what each sync made
//! durable and can produce the disk image a power cut would leave: unsynced
//! writes dropped or applied in any order, unsynced directory changes lost.
//!
//! [`IoStats`] counts what the layer does (bytes, syncs), so benchmarks and
//! tests can report counts, which are stable on a noisy machine.

use crate::error::{Error, Result};
use std::any::Any;
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters of storage I/O, shared by a file system and its files.
#[derive(Debug, Default)]
pub struct IoStats {
    /// Bytes returned by reads.
    pub bytes_read: AtomicU64,
    /// Bytes handed to writes.
    pub bytes_written: AtomicU64,
    /// `fdatasync` calls on files.
    pub file_syncs: AtomicU64,
    /// `fsync` calls on directories.
    pub dir_syncs: AtomicU64,
    /// Files opened.
    pub opens: AtomicU64,
}

impl IoStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Current values as `(name, value)` pairs.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("bytes_read", g(&self.bytes_read)),
            ("bytes_written", g(&self.bytes_written)),
            ("file_syncs", g(&self.file_syncs)),
            ("dir_syncs", g(&self.dir_syncs)),
            ("opens", g(&self.opens)),
        ]
    }
}

/// How to open a file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenMode {
    /// Open for writing too.
    pub write: bool,
    /// Create it if missing.
    pub create: bool,
    /// Fail if it exists (implies `create`); never follows a symlink.
    pub create_new: bool,
    /// Cut it to zero length.
    pub truncate: bool,
}

impl OpenMode {
    /// Read only.
    pub const READ: Self = Self {
        write: false,
        create: false,
        create_new: false,
        truncate: false,
    };
    /// Read and write an existing file.
    pub const WRITE: Self = Self {
        write: true,
        create: false,
        create_new: false,
        truncate: false,
    };
    /// Read and write, creating the file if missing (keeps its content).
    pub const CREATE: Self = Self {
        write: true,
        create: true,
        create_new: false,
        truncate: false,
    };
    /// A new file; fails if the name exists.
    pub const CREATE_NEW: Self = Self {
        write: true,
        create: true,
        create_new: true,
        truncate: false,
    };
}

/// An open file.
pub trait FsFile: Send + Sync + fmt::Debug {
    /// Reads at `off`; fewer bytes than asked only at the end of the file.
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize>;
    /// Writes every buffer, back to back, at `off`.
    fn write_all_vectored_at(&self, bufs: &[&[u8]], off: u64) -> io::Result<()>;
    /// Makes the data (and the size) durable: `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    /// Sets the size (truncating or zero-extending).
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves disk blocks so that the file is at least `end` bytes long.
    fn allocate(&self, end: u64) -> io::Result<()>;
    /// Current size.
    fn size(&self) -> io::Result<u64>;
    /// Asks for writeback of `[off, off+len)` to start now (a hint only).
    fn writeback_hint(&self, _off: u64, _len: u64) {}

    /// Reads exactly `buf.len()` bytes at `off` (`UnexpectedEof` if short).
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            match self.read_at(&mut buf[got..], off + got as u64) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `buf` at `off`.
    fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.write_all_vectored_at(&[buf], off)
    }
}

/// A held writer lock; released when dropped.
pub type LockGuard = Box<dyn Any + Send + Sync>;

/// The file system the storage layer runs on.
pub trait Fs: Send + Sync + fmt::Debug + 'static {
    /// Opens `path`.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FsFile>>;
    /// Creates one directory level (`AlreadyExists` if it is there).
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Names in a directory.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>>;
    /// True if `path` is a directory.
    fn is_dir(&self, path: &Path) -> bool;
    /// True if `path` names anything.
    fn exists(&self, path: &Path) -> bool;
    /// Renames (replacing `to`).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty directory.
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
    /// Makes the names in a directory durable (`fsync` on it).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Takes the exclusive writer lock on `path` (created if missing) without
    /// waiting; `WouldBlock` if another process holds it.
    fn lock(&self, path: &Path) -> io::Result<LockGuard>;
    /// True if some process holds the writer lock on `path` (probe only).
    fn is_locked(&self, path: &Path) -> io::Result<bool>;
    /// The I/O counters.
    fn stats(&self) -> &IoStats;
    /// Makes everything written to the file system holding `path` durable,
    /// data and names alike (`syncfs`): one call instead of thousands of
    /// `fsync`s when a checkpoint touched thousands of files.
    fn sync_filesystem(&self, path: &Path) -> io::Result<()>;
    /// A canonical name for `path` (the same directory always gets the
    /// same one); `path` itself where it cannot be resolved.
    fn canonicalize(&self, path: &Path) -> std::path::PathBuf {
        path.to_path_buf()
    }

    /// The whole content of a file.
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        let f = self.open(path, OpenMode::READ)?;
        let len = f.size()?;
        let n = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let mut buf = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match f.read_at(&mut buf[got..], got as u64)? {
                0 => break,
                k => got += k,
            }
        }
        buf.truncate(got);
        Ok(buf)
    }
}

/// Creates `dir` and any missing parents without syncing (the caller syncs
/// their parents before relying on them); returns the ones created.
pub fn make_dirs(fs: &dyn Fs, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut p = Some(dir);
    while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
        if fs.is_dir(d) {
            break;
        }
        missing.push(d.to_path_buf());
        p = d.parent();
    }
    missing.reverse();
    for d in &missing {
        match fs.create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && fs.is_dir(d) => {}
            Err(e) => return Err(Error::io(format!("creating directory {}", d.display()), &e)),
        }
    }
    Ok(missing)
}

// ------------------------------------------------------------------ real

/// The operating system's file system.
#[derive(Debug, Default)]
pub struct RealFs {
    stats: Arc<IoStats>,
}

impl RealFs {
    /// A real file system with fresh counters.
    pub fn new() -> Self {
        Self::default()
    }
}

#[derive(Debug)]
struct RealFile {
    file: File,
    stats: Arc<IoStats>,
}

/// Most buffers per `pwritev` (Linux `IOV_MAX`).
const MAX_IOV: usize = 1024;

fn pwritev_all(file: &File, bufs: &[&[u8]], mut off: u64) -> io::Result<()> {
    let mut left: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
    let mut first = 0;
    while first < left.len() {
        let end = left.len().min(first + MAX_IOV);
        let iov: Vec<libc::iovec> = left[first..end]
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: every iovec points into a slice borrowed for the whole call,
        // the count is the array's length (<= IOV_MAX), and pwritev only reads
        // from them; the descriptor is owned by `file`.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                off as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut n = n as usize;
        off += n as u64;
        while n > 0 && first < left.len() {
            let l = left[first].len();
            if n >= l {
                n -= l;
                first += 1;
            } else {
                left[first] = &left[first][n..];
                n = 0;
            }
        }
    }
    Ok(())
}

impl FsFile for RealFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let n = self.file.read_at(buf, off)?;
        IoStats::add(&self.stats.bytes_read, n as u64);
        Ok(n)
    }

    fn write_all_vectored_at(&self, bufs: &[&[u8]], off: u64) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        pwritev_all(&self.file, bufs, off)?;
        IoStats::add(&self.stats.bytes_written, total as u64);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        IoStats::add(&self.stats.file_syncs, 1);
        self.file.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn allocate(&self, end: u64) -> io::Result<()> {
        let len = i64::try_from(end).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: plain syscall on a valid, owned descriptor; no memory shared.
        let rc = unsafe { libc::posix_fallocate(self.file.as_raw_fd(), 0, len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(rc))
        }
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn writeback_hint(&self, off: u64, len: u64) {
        // SAFETY: plain syscall on a valid, owned descriptor; no memory is
        // shared. Purely a hint: durability still comes from sync_data.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                off as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }
}

/// An open-file-description lock on the LOCK file (`F_OFD_SETLK`): held
/// per open file, released on close, probe-able with `F_OFD_GETLK` by a
/// reader without taking it (unlike `flock`).
#[derive(Debug)]
struct OfdLock {
    _file: File,
    /// Its slot in the fork module's table (a forked child lets go of it).
    slot: Option<usize>,
}

impl Drop for OfdLock {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            crate::fork::forget_lock_fd(slot);
        }
    }
}

fn ofd_lock_struct(kind: libc::c_short) -> libc::flock {
    // SAFETY: `flock` is a plain C struct for which all-zero bytes are valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0;
    fl.l_pid = 0;
    fl
}

impl Fs for RealFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FsFile>> {
        let mut o = OpenOptions::new();
        o.read(true)
            .write(mode.write)
            .create(mode.create && !mode.create_new)
            .create_new(mode.create_new)
            .truncate(mode.truncate);
        if mode.create_new {
            // A planted symlink must not redirect a new file elsewhere.
            o.custom_flags(libc::O_NOFOLLOW);
        }
        let file = o.open(path)?;
        IoStats::add(&self.stats.opens, 1);
        Ok(Arc::new(RealFile {
            file,
            stats: Arc::clone(&self.stats),
        }))
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn exists(&self, path: &Path) -> bool {
        path.symlink_metadata().is_ok()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        IoStats::add(&self.stats.dir_syncs, 1);
        File::open(path)?.sync_all()
    }

    fn lock(&self, path: &Path) -> io::Result<LockGuard> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let fl = ofd_lock_struct(libc::F_WRLCK as libc::c_short);
        // SAFETY: fcntl with a valid descriptor and a pointer to a live,
        // initialised flock struct for the duration of the call.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let slot = crate::fork::remember_lock_fd(file.as_raw_fd());
        Ok(Box::new(OfdLock { _file: file, slot }))
    }

    fn is_locked(&self, path: &Path) -> io::Result<bool> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let mut fl = ofd_lock_struct(libc::F_WRLCK as libc::c_short);
        // SAFETY: fcntl with a valid descriptor and a pointer to a live flock
        // struct it may fill in.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
    }

    fn stats(&self) -> &IoStats {
        &self.stats
    }

    fn canonicalize(&self, path: &Path) -> std::path::PathBuf {
        std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
    }

    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        IoStats::add(&self.stats.dir_syncs, 1);
        let f = File::open(path)?;
        // SAFETY: plain syscall on a valid descriptor we own; no memory is
        // shared. (Since Linux 5.8 it reports writeback errors.)
        let rc = unsafe { libc::syncfs(f.as_raw_fd()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}
