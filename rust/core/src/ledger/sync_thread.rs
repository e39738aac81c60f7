//! The sync thread: second stage of the group-commit pipeline (see
//! [`super::writer_thread`]). It syncs the groups the writer thread hands
//! it, publishes what it synced and completes the callers, in append order.

use super::fault::FaultKind;
use super::segment::{datasync, encode_synced, Segment};
use super::writer_thread::Staged;
use super::Shared;
use crate::error::{Error, Result};
use crate::position::Position;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A group the writer thread has written (not yet synced).
pub(crate) struct SyncJob {
    pub seg: Arc<Segment>,
    pub hint: Arc<File>,
    /// File offset of each record and its payload length.
    pub offsets: Vec<u64>,
    pub lens: Vec<u32>,
    /// File offset just past the group.
    pub end: u64,
    pub staged: Vec<Staged>,
}

#[derive(Default)]
struct State {
    /// Jobs handed over and not yet settled (completed or given back).
    inflight: usize,
    /// A failed sync, and the callers of every group since then, in append
    /// order, for the writer thread to fail (it must cut the file first).
    failed: Option<(Error, Vec<Staged>)>,
}

/// What the two threads share about groups in flight.
#[derive(Default)]
pub(crate) struct Pipeline {
    state: Mutex<State>,
    idle: Condvar,
}

impl Pipeline {
    /// `Ok(true)` if no handed-over group is unsettled, `Ok(false)` if one
    /// is; the pending sync failure, if any.
    pub fn is_idle(&self) -> Result<bool> {
        let s = self.state.lock();
        match &s.failed {
            Some((e, _)) => Err(e.clone()),
            None => Ok(s.inflight == 0),
        }
    }

    pub fn submitted(&self) {
        self.state.lock().inflight += 1;
    }

    pub fn settled(&self, n: usize) {
        let mut s = self.state.lock();
        s.inflight -= n;
        if s.inflight == 0 {
            self.idle.notify_all();
        }
    }

    /// The pending sync failure, if any (without waiting).
    pub fn failure(&self) -> Option<Error> {
        self.state.lock().failed.as_ref().map(|(e, _)| e.clone())
    }

    /// Waits until every handed-over group is settled; the pending sync
    /// failure, if any.
    pub fn wait_idle(&self) -> Option<Error> {
        let mut s = self.state.lock();
        while s.inflight > 0 {
            self.idle.wait(&mut s);
        }
        s.failed.as_ref().map(|(e, _)| e.clone())
    }

    /// Waits until idle and takes the failure and the callers it holds.
    pub fn take_failure(&self) -> Option<(Error, Vec<Staged>)> {
        let mut s = self.state.lock();
        while s.inflight > 0 {
            self.idle.wait(&mut s);
        }
        s.failed.take()
    }

    fn give_back(&self, e: Option<Error>, jobs: Vec<SyncJob>) {
        let mut s = self.state.lock();
        let failed = s.failed.get_or_insert_with(|| {
            (
                e.unwrap_or_else(|| Error::invalid("sync failed")),
                Vec::new(),
            )
        });
        failed.1.extend(jobs.into_iter().flat_map(|j| j.staged));
    }
}

/// Starts the sync thread for one managed ledger. `wake` tells an idle
/// writer thread that a sync failed.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    pipe: Arc<Pipeline>,
    jobs: Receiver<SyncJob>,
    wake: Sender<()>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("ledger-sync-{}", shared.name))
        .spawn(move || run(&shared, &pipe, &jobs, &wake))
}

fn run(shared: &Shared, pipe: &Pipeline, rx: &Receiver<SyncJob>, wake: &Sender<()>) {
    while let Ok(first) = rx.recv() {
        // Everything written so far shares one sync.
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        let n = jobs.len();
        let outcome = match pipe.failure() {
            // Groups written after a failed sync are never acknowledged:
            // the writer thread cuts them off.
            Some(_) => Err((None, jobs)),
            None => sync_and_complete(shared, jobs).map_err(|(e, jobs)| (Some(e), jobs)),
        };
        match outcome {
            Ok(()) => pipe.settled(n),
            Err((e, jobs)) => {
                pipe.give_back(e, jobs);
                pipe.settled(n);
                // A full channel means a wake-up is pending already.
                let _ = wake.try_send(());
            }
        }
    }
}

/// Syncs the written `jobs`, publishes them and completes their callers in
/// order; on a failed sync nothing is published and the jobs come back.
pub(crate) fn sync_and_complete(
    shared: &Shared,
    jobs: Vec<SyncJob>,
) -> std::result::Result<(), (Error, Vec<SyncJob>)> {
    if let Err(e) = sync_all(shared, &jobs) {
        return Err((e, jobs));
    }
    publish(&jobs);
    for job in jobs {
        let id = job.seg.id;
        for s in job.staged {
            let ps = (s.first..s.first + s.n)
                .map(|e| Position::new(id, e))
                .collect();
            s.done.complete(Ok(ps));
        }
    }
    Ok(())
}

/// Syncs every ledger file the jobs were written to (one, except right
/// after a rollover).
fn sync_all(shared: &Shared, jobs: &[SyncJob]) -> Result<()> {
    let mut last: Option<&Arc<Segment>> = None;
    for job in jobs {
        if last.is_some_and(|s| Arc::ptr_eq(s, &job.seg)) {
            continue;
        }
        last = Some(&job.seg);
        shared
            .faults
            .check(FaultKind::Sync)
            .and_then(|()| datasync(&job.seg.file))
            .map_err(|e| {
                Error::io(
                    format!("syncing ledger file {}", job.seg.path.display()),
                    &e,
                )
            })?;
    }
    Ok(())
}

/// Makes synced groups readable: the index for this process, the
/// `.synced` hint for others, before anyone is acknowledged.
fn publish(jobs: &[SyncJob]) {
    for (i, job) in jobs.iter().enumerate() {
        {
            let mut idx = job.seg.index.write();
            idx.offsets.extend_from_slice(&job.offsets);
            idx.lens.extend_from_slice(&job.lens);
            idx.end = job.end;
        }
        let last_of_file = jobs
            .get(i + 1)
            .is_none_or(|next| !Arc::ptr_eq(&next.seg, &job.seg));
        if last_of_file {
            // A failed hint write only makes readers lag.
            let _ = job.hint.write_all_at(&encode_synced(job.end), 0);
        }
    }
}
