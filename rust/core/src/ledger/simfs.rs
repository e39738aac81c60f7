//! A simulated file system that can lose power (cargo feature `testing`).
//!
//! Files and directories live in memory. Each file remembers its durable
//! content (as of its last `sync_data`) and the writes and size changes
//! since; each directory remembers its durable names (as of its last
//! `sync_dir`) and the creates, renames and removes since.
//! [`SimFs::power_cut`] returns the disk a power cut at this instant could
//! leave behind, chosen by a seed:
//!
//! - every 512-byte sector written since the last sync holds, independently,
//!   its durable bytes or any one of the versions written since (so writes
//!   are dropped, torn at sector boundaries, or land in any order);
//! - the size is the durable one or any size set since;
//! - a directory keeps its durable names plus a random prefix of the name
//!   changes since (a journaling file system commits them in order), so an
//!   unsynced create can vanish with the file's synced data.
//!
//! Locks do not survive (the image has no running process).

use super::fs::{Fs, FsFile, IoStats, LockGuard, OpenMode};
use crate::sync::{Mutex, RwLock};
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Sector size: the unit a power cut tears writes at.
pub const SECTOR: u64 = 512;

/// A small deterministic generator (splitmix64), so images are reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write { off: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct InodeData {
    current: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Op>,
}

#[derive(Debug, Default)]
struct Inode {
    data: Mutex<InodeData>,
}

impl InodeData {
    fn set_len(&mut self, len: u64) {
        self.current.resize(len as usize, 0);
        self.pending.push(Op::SetLen(len));
    }

    /// The content a power cut could leave.
    fn image(&self, rng: &mut Rng) -> Vec<u8> {
        if self.pending.is_empty() {
            return self.durable.clone();
        }
        // Candidate sizes: the durable one, and after every size change
        // (a write past the end also changes it).
        let mut sizes = vec![self.durable.len() as u64];
        let mut len = self.durable.len() as u64;
        // Per sector: the versions written since the last sync.
        let mut versions: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        let mut snapshot = self.durable.clone();
        for op in &self.pending {
            match op {
                Op::SetLen(l) => {
                    len = *l;
                    snapshot.resize(len as usize, 0);
                    sizes.push(len);
                }
                Op::Write { off, bytes } => {
                    let end = off + bytes.len() as u64;
                    if end as usize > snapshot.len() {
                        snapshot.resize(end as usize, 0);
                    }
                    snapshot[*off as usize..end as usize].copy_from_slice(bytes);
                    if end > len {
                        len = end;
                        sizes.push(len);
                    }
                    let mut s = off / SECTOR;
                    while s * SECTOR < end {
                        let a = (s * SECTOR) as usize;
                        let b = (((s + 1) * SECTOR) as usize).min(snapshot.len());
                        versions.entry(s).or_default().push(snapshot[a..b].to_vec());
                        s += 1;
                    }
                }
            }
        }
        let size = sizes[rng.below(sizes.len() as u64) as usize] as usize;
        let mut out = self.durable.clone();
        out.resize(size, 0);
        for (s, vs) in versions {
            let pick = rng.below(vs.len() as u64 + 1) as usize;
            if pick == 0 {
                continue; // the durable bytes
            }
            let v = &vs[pick - 1];
            let a = (s * SECTOR) as usize;
            if a >= size {
                continue;
            }
            let b = (a + v.len()).min(size);
            out[a..b].copy_from_slice(&v[..b - a]);
        }
        out
    }
}

#[derive(Debug, Clone)]
enum Node {
    File(Arc<Inode>),
    Dir,
}

#[derive(Debug, Clone)]
enum DirOp {
    Create(OsString, Node),
    Remove(OsString),
    Rename(OsString, OsString),
}

#[derive(Debug, Default)]
struct DirNode {
    current: BTreeMap<OsString, Node>,
    durable: BTreeMap<OsString, Node>,
    pending: Vec<DirOp>,
}

fn apply(map: &mut BTreeMap<OsString, Node>, op: &DirOp) {
    match op {
        DirOp::Create(n, node) => {
            map.insert(n.clone(), node.clone());
        }
        DirOp::Remove(n) => {
            map.remove(n);
        }
        DirOp::Rename(a, b) => {
            if let Some(node) = map.remove(a) {
                map.insert(b.clone(), node);
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    dirs: BTreeMap<PathBuf, DirNode>,
    locks: HashSet<PathBuf>,
}

fn split(path: &Path) -> io::Result<(PathBuf, OsString)> {
    match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) => Ok((p.to_path_buf(), n.to_os_string())),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad path {}", path.display()),
        )),
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file or directory", path.display()),
    )
}

/// The simulated file system; cheap to share as `Arc<SimFs>`.
#[derive(Debug)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
    stats: IoStats,
    /// Number of `sync_data` calls that will fail with `EIO` before the
    /// next succeeds (a failing disk), counting down.
    fail_syncs: Arc<AtomicU64>,
    /// File writes and syncs hold it shared; a power cut holds it alone, so
    /// the image is one instant of every file (directory changes are
    /// already serialised by `state`).
    gate: Arc<RwLock<()>>,
}

impl Default for SimFs {
    fn default() -> Self {
        Self::new()
    }
}

impl SimFs {
    /// An empty file system holding only `/`.
    pub fn new() -> Self {
        let mut st = State::default();
        st.dirs.insert(PathBuf::from("/"), DirNode::default());
        Self {
            state: Arc::new(Mutex::new(st)),
            stats: IoStats::default(),
            fail_syncs: Arc::new(AtomicU64::new(0)),
            gate: Arc::new(RwLock::new(())),
        }
    }

    /// Makes the next `n` file syncs fail with `EIO`.
    pub fn fail_next_syncs(&self, n: u64) {
        self.fail_syncs.store(n, Ordering::SeqCst);
    }

    /// The disk a power cut now could leave (see the module docs).
    pub fn power_cut(&self, seed: u64) -> SimFs {
        let mut rng = Rng::new(seed);
        let _instant = self.gate.write();
        let st = self.state.lock();
        let out = SimFs::new();
        let mut ost = out.state.lock();
        ost.dirs.clear();
        // Walk from the root through the names that survive.
        let mut todo = vec![PathBuf::from("/")];
        let mut images: Vec<(Arc<Inode>, Arc<Inode>)> = Vec::new();
        while let Some(path) = todo.pop() {
            let Some(d) = st.dirs.get(&path) else {
                continue;
            };
            let mut names = d.durable.clone();
            let keep = rng.below(d.pending.len() as u64 + 1) as usize;
            for op in &d.pending[..keep] {
                apply(&mut names, op);
            }
            let mut nd = DirNode::default();
            for (name, node) in names {
                let node = match node {
                    Node::Dir => {
                        todo.push(path.join(&name));
                        Node::Dir
                    }
                    Node::File(ino) => {
                        // A file linked twice (rename pending) keeps one image.
                        let copy = match images.iter().find(|(o, _)| Arc::ptr_eq(o, &ino)) {
                            Some((_, c)) => Arc::clone(c),
                            None => {
                                let content = ino.data.lock().image(&mut rng);
                                let c = Arc::new(Inode {
                                    data: Mutex::new(InodeData {
                                        current: content.clone(),
                                        durable: content,
                                        pending: Vec::new(),
                                    }),
                                });
                                images.push((Arc::clone(&ino), Arc::clone(&c)));
                                c
                            }
                        };
                        Node::File(copy)
                    }
                };
                nd.current.insert(name.clone(), node.clone());
                nd.durable.insert(name, node);
            }
            ost.dirs.insert(path, nd);
        }
        drop(ost);
        out
    }

    /// Copies a real directory tree into `at` (durably), e.g. a data
    /// directory written by [`RealFs`](super::fs::RealFs).
    pub fn import(&self, real: &Path, at: &Path) -> io::Result<()> {
        let mut p = PathBuf::from("/");
        for c in at.components().skip(1) {
            p.push(c);
            if !self.exists(&p) {
                self.create_dir(&p)?;
            }
        }
        for e in std::fs::read_dir(real)? {
            let e = e?;
            let dst = at.join(e.file_name());
            if e.file_type()?.is_dir() {
                self.create_dir(&dst)?;
                self.import(&e.path(), &dst)?;
            } else {
                let f = self.open(&dst, OpenMode::CREATE)?;
                f.write_all_at(&std::fs::read(e.path())?, 0)?;
                f.sync_data()?;
            }
        }
        self.sync_dir(at)
    }

    /// The current content of a file (for tests that damage images).
    pub fn file_bytes(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.read_file(path)
    }

    /// Replaces a file's content durably (for tests that damage images).
    pub fn put_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let f = self.open(path, OpenMode::CREATE)?;
        f.set_len(0)?;
        f.write_all_at(bytes, 0)?;
        f.sync_data()
    }

    fn lookup(&self, path: &Path) -> io::Result<Node> {
        if path == Path::new("/") {
            return Ok(Node::Dir);
        }
        let (parent, name) = split(path)?;
        let st = self.state.lock();
        st.dirs
            .get(&parent)
            .and_then(|d| d.current.get(&name))
            .cloned()
            .ok_or_else(|| not_found(path))
    }
}

#[derive(Debug)]
struct SimFile {
    ino: Arc<Inode>,
    write: bool,
    fs_fail: Arc<AtomicU64>,
    gate: Arc<RwLock<()>>,
}

impl FsFile for SimFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let d = self.ino.data.lock();
        let len = d.current.len() as u64;
        if off >= len {
            return Ok(0);
        }
        let n = ((len - off) as usize).min(buf.len());
        buf[..n].copy_from_slice(&d.current[off as usize..off as usize + n]);
        Ok(n)
    }

    fn write_all_vectored_at(&self, bufs: &[&[u8]], off: u64) -> io::Result<()> {
        let _g = self.gate.read();
        if !self.write {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        let bytes = bufs.concat();
        let mut d = self.ino.data.lock();
        let end = off as usize + bytes.len();
        if end > d.current.len() {
            d.current.resize(end, 0);
        }
        d.current[off as usize..end].copy_from_slice(&bytes);
        d.pending.push(Op::Write { off, bytes });
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let _g = self.gate.read();
        let left = self.fs_fail.load(Ordering::SeqCst);
        if left > 0 {
            self.fs_fail.store(left - 1, Ordering::SeqCst);
            // As Linux does: the failed pages are marked clean, so nothing
            // changes durably now, and a later sync will not retry them.
            let mut d = self.ino.data.lock();
            d.pending.clear();
            d.durable = d.current.clone();
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let mut d = self.ino.data.lock();
        d.durable = d.current.clone();
        d.pending.clear();
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let _g = self.gate.read();
        self.ino.data.lock().set_len(len);
        Ok(())
    }

    fn allocate(&self, end: u64) -> io::Result<()> {
        let _g = self.gate.read();
        let mut d = self.ino.data.lock();
        if (d.current.len() as u64) < end {
            d.set_len(end);
        }
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.ino.data.lock().current.len() as u64)
    }
}

#[derive(Debug)]
struct SimLock {
    state: Arc<Mutex<State>>,
    path: PathBuf,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.state.lock().locks.remove(&self.path);
    }
}

impl Fs for SimFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FsFile>> {
        IoStats::add(&self.stats.opens, 1);
        let (parent, name) = split(path)?;
        let mut st = self.state.lock();
        let dir = st.dirs.get_mut(&parent).ok_or_else(|| not_found(path))?;
        let ino = match dir.current.get(&name) {
            Some(Node::Dir) => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
            Some(Node::File(_)) if mode.create_new => {
                return Err(io::ErrorKind::AlreadyExists.into())
            }
            Some(Node::File(ino)) => Arc::clone(ino),
            None if mode.create || mode.create_new => {
                let ino = Arc::new(Inode::default());
                dir.current
                    .insert(name.clone(), Node::File(Arc::clone(&ino)));
                dir.pending
                    .push(DirOp::Create(name, Node::File(Arc::clone(&ino))));
                ino
            }
            None => return Err(not_found(path)),
        };
        drop(st);
        if mode.truncate {
            ino.data.lock().set_len(0);
        }
        Ok(Arc::new(SimFile {
            ino,
            write: mode.write,
            fs_fail: Arc::clone(&self.fail_syncs),
            gate: Arc::clone(&self.gate),
        }))
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = split(path)?;
        let mut st = self.state.lock();
        if st.dirs.contains_key(path) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        let dir = st.dirs.get_mut(&parent).ok_or_else(|| not_found(path))?;
        if dir.current.contains_key(&name) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        dir.current.insert(name.clone(), Node::Dir);
        dir.pending.push(DirOp::Create(name, Node::Dir));
        st.dirs.insert(path.to_path_buf(), DirNode::default());
        Ok(())
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        let st = self.state.lock();
        let d = st.dirs.get(path).ok_or_else(|| not_found(path))?;
        Ok(d.current.keys().cloned().collect())
    }

    fn is_dir(&self, path: &Path) -> bool {
        matches!(self.lookup(path), Ok(Node::Dir))
    }

    fn exists(&self, path: &Path) -> bool {
        self.lookup(path).is_ok()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (pa, na) = split(from)?;
        let (pb, nb) = split(to)?;
        if pa != pb {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        let mut st = self.state.lock();
        let dir = st.dirs.get_mut(&pa).ok_or_else(|| not_found(from))?;
        let node = dir.current.remove(&na).ok_or_else(|| not_found(from))?;
        dir.current.insert(nb.clone(), node);
        dir.pending.push(DirOp::Rename(na, nb));
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = split(path)?;
        let mut st = self.state.lock();
        let dir = st.dirs.get_mut(&parent).ok_or_else(|| not_found(path))?;
        match dir.current.get(&name) {
            Some(Node::File(_)) => {}
            Some(Node::Dir) => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
            None => return Err(not_found(path)),
        }
        dir.current.remove(&name);
        dir.pending.push(DirOp::Remove(name));
        Ok(())
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = split(path)?;
        let mut st = self.state.lock();
        if st.dirs.get(path).is_some_and(|d| !d.current.is_empty()) {
            return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
        }
        let dir = st.dirs.get_mut(&parent).ok_or_else(|| not_found(path))?;
        dir.current.remove(&name).ok_or_else(|| not_found(path))?;
        dir.pending.push(DirOp::Remove(name));
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        IoStats::add(&self.stats.dir_syncs, 1);
        let mut st = self.state.lock();
        let d = st.dirs.get_mut(path).ok_or_else(|| not_found(path))?;
        d.durable = d.current.clone();
        d.pending.clear();
        Ok(())
    }

    fn lock(&self, path: &Path) -> io::Result<LockGuard> {
        if !self.exists(path) {
            self.open(path, OpenMode::CREATE)?;
        }
        let mut st = self.state.lock();
        if !st.locks.insert(path.to_path_buf()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(Box::new(SimLock {
            state: Arc::clone(&self.state),
            path: path.to_path_buf(),
        }))
    }

    fn is_locked(&self, path: &Path) -> io::Result<bool> {
        Ok(self.state.lock().locks.contains(path))
    }

    fn stats(&self) -> &IoStats {
        &self.stats
    }

    fn sync_filesystem(&self, _path: &Path) -> io::Result<()> {
        IoStats::add(&self.stats.dir_syncs, 1);
        let mut st = self.state.lock();
        for d in st.dirs.values_mut() {
            d.durable = d.current.clone();
            d.pending.clear();
            for node in d.current.values() {
                if let Node::File(ino) = node {
                    let mut data = ino.data.lock();
                    data.durable = data.current.clone();
                    data.pending.clear();
                }
            }
        }
        Ok(())
    }
}
