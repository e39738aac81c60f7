//! Recovery fold of a coordinator's transaction log, in bulk (SPEC §4.3).
//!
//! The state machine lives in Python; folding a million log records into
//! the live transactions does not: Python would build an object per record
//! and per position. [`TxnLogFolder`] takes records in log order (with
//! their positions, and whether their batch index was already deleted) and
//! yields the live transactions with interned strings and flat positions,
//! plus the positions of records to purge.
//!
//! Rules (same as the Python reference `txnstream.coordinator.replay.fold`):
//! only records of this coordinator (`most_bits == tc_id`) count; deleted
//! records only bound the sequence. A transaction's status is the highest
//! `new_status` of its UPDATE records (the two branches never mix, so that
//! is the last one reached), OPEN if none. A transaction whose NEW record is
//! gone, or whose status is final, has ended: its remaining records are
//! purged. Timeout, start time and client name come from the NEW record;
//! partitions and subscriptions are the union in first-seen order;
//! `last_modified` is the largest of the start time and the non-NEW
//! records' modification times; `timed_out` is set when any UPDATE record
//! carries the txnstream `timed_out` extension (an abort by the timer).

use crate::ackset::AckSet;
use crate::error::{Error, Result};
use crate::ledger::Cursor;
use crate::position::{Position, TxnPosition};
use crate::replay::{entry_records, scan_cursor};
use crate::txnlog_record::{
    decode, OP_ADD_PARTITION, OP_ADD_SUBSCRIPTION, OP_NEW, OP_UPDATE, STATUS_ABORTED,
    STATUS_COMMITTED, STATUS_OPEN,
};
use std::collections::HashMap;

/// Interned id meaning "no client name".
pub const NO_NAME: u32 = u32::MAX;

/// One live transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveTxn {
    /// Sequence (`least_bits`).
    pub seq: u64,
    /// Current status (OPEN, COMMITTING or ABORTING).
    pub status: i8,
    /// Timeout from the NEW record.
    pub timeout_ms: u64,
    /// Start time from the NEW record.
    pub start_time: u64,
    /// Latest modification time seen.
    pub last_modified: u64,
    /// Interned client name, or [`NO_NAME`].
    pub client_name: u32,
    /// Interned partition names.
    pub partitions: Vec<u32>,
    /// Interned `(topic, subscription)` pairs (see [`Folded::pairs`]).
    pub subscriptions: Vec<u32>,
    /// Positions of its live records, in log order.
    pub positions: Vec<TxnPosition>,
    /// Its end was caused by the timeout (ABORTING by the timer).
    pub timed_out: bool,
}

/// The result of folding a whole log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Folded {
    /// Interned strings (partition, topic, subscription and client names).
    pub strings: Vec<String>,
    /// Interned subscriptions: `(topic, subscription)` as string ids.
    pub pairs: Vec<(u32, u32)>,
    /// Live transactions by sequence.
    pub txns: Vec<LiveTxn>,
    /// Live records of ended transactions, in log order.
    pub purge: Vec<TxnPosition>,
    /// Highest sequence any record of this coordinator mentions (deleted
    /// records included), `None` when there is none.
    pub max_seq: Option<u64>,
    /// Records seen (deleted ones included).
    pub records: u64,
    /// Live records of live transactions.
    pub live_records: u64,
    /// Live records of other coordinators (left alone).
    pub foreign_records: u64,
}

#[derive(Debug)]
struct Acc {
    has_new: bool,
    status: i8,
    timeout_ms: u64,
    start_time: u64,
    last_modified: u64,
    client_name: u32,
    partitions: Vec<u32>,
    subscriptions: Vec<u32>,
    positions: Vec<TxnPosition>,
    timed_out: bool,
}

impl Acc {
    fn new() -> Self {
        Self {
            has_new: false,
            status: -1,
            timeout_ms: 0,
            start_time: 0,
            last_modified: 0,
            client_name: NO_NAME,
            partitions: Vec::new(),
            subscriptions: Vec::new(),
            positions: Vec::new(),
            timed_out: false,
        }
    }
}

#[derive(Debug, Default)]
struct Interner {
    ids: HashMap<String, u32>,
    strings: Vec<String>,
    pair_ids: HashMap<(u32, u32), u32>,
    pairs: Vec<(u32, u32)>,
}

impl Interner {
    fn string(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.to_owned());
        self.ids.insert(s.to_owned(), id);
        id
    }

    fn pair(&mut self, topic: &str, sub: &str) -> u32 {
        let key = (self.string(topic), self.string(sub));
        if let Some(&id) = self.pair_ids.get(&key) {
            return id;
        }
        let id = self.pairs.len() as u32;
        self.pairs.push(key);
        self.pair_ids.insert(key, id);
        id
    }
}

/// Folds records, fed in log order, into live transactions.
#[derive(Debug)]
pub struct TxnLogFolder {
    tc_id: u64,
    txns: HashMap<u64, Acc>,
    names: Interner,
    max_seq: Option<u64>,
    records: u64,
    foreign: u64,
}

impl TxnLogFolder {
    /// A folder for coordinator `tc_id`.
    pub fn new(tc_id: u64) -> Self {
        Self {
            tc_id,
            txns: HashMap::new(),
            names: Interner::default(),
            max_seq: None,
            records: 0,
            foreign: 0,
        }
    }

    /// Adds one record at `pos`; `deleted` records only bound the sequence.
    /// A malformed record is a `CorruptEntry` naming its entry.
    pub fn push(&mut self, record: &[u8], pos: TxnPosition, deleted: bool) -> Result<()> {
        let r = decode(record).map_err(|e| with_index(e, pos))?;
        self.records += 1;
        if r.most_bits != self.tc_id {
            if !deleted {
                self.foreign += 1;
            }
            return Ok(());
        }
        let top = r.max_local_txn_id.max(r.least_bits);
        self.max_seq = Some(self.max_seq.map_or(top, |m| m.max(top)));
        if deleted {
            return Ok(());
        }
        if r.op == OP_UPDATE && !(-1..=STATUS_ABORTED).contains(&r.new_status) {
            return Err(with_index(
                Error::corrupt_entry(0, format!("unknown new_status {}", r.new_status)),
                pos,
            ));
        }
        let acc = self.txns.entry(r.least_bits).or_insert_with(Acc::new);
        acc.positions.push(pos);
        match r.op {
            OP_NEW => {
                acc.has_new = true;
                acc.timeout_ms = r.timeout_ms;
                acc.start_time = r.start_time;
                acc.last_modified = acc.last_modified.max(r.start_time);
                acc.client_name = if r.client_name.is_empty() {
                    NO_NAME
                } else {
                    self.names.string(r.client_name)
                };
                return Ok(());
            }
            OP_ADD_PARTITION => {
                for p in &r.partitions {
                    let id = self.names.string(p);
                    if !acc.partitions.contains(&id) {
                        acc.partitions.push(id);
                    }
                }
            }
            OP_ADD_SUBSCRIPTION => {
                for (t, s) in &r.subscriptions {
                    let id = self.names.pair(t, s);
                    if !acc.subscriptions.contains(&id) {
                        acc.subscriptions.push(id);
                    }
                }
            }
            OP_UPDATE => {
                acc.status = acc.status.max(r.new_status);
                acc.timed_out |= r.timed_out;
            }
            _ => {}
        }
        acc.last_modified = acc.last_modified.max(r.last_modification_time);
        Ok(())
    }

    /// Adds every record of the entry at `pos`; `acks` is the cursor's ack
    /// set for it (bit clear: that batch index is deleted).
    pub fn push_entry(&mut self, pos: Position, entry: &[u8], acks: Option<&AckSet>) -> Result<()> {
        for rec in entry_records(pos, entry, acks)? {
            self.push(rec.data, rec.position, rec.deleted)?;
        }
        Ok(())
    }

    /// The live transactions (by sequence) and the records to purge.
    pub fn finish(self) -> Folded {
        let mut txns = Vec::new();
        let mut purge = Vec::new();
        let mut live_records = 0u64;
        for (seq, a) in self.txns {
            let status = if a.status < 0 { STATUS_OPEN } else { a.status };
            let ended = status == STATUS_COMMITTED || status == STATUS_ABORTED;
            if !a.has_new || ended {
                purge.extend(a.positions);
                continue;
            }
            live_records += a.positions.len() as u64;
            txns.push(LiveTxn {
                seq,
                status,
                timeout_ms: a.timeout_ms,
                start_time: a.start_time,
                last_modified: a.last_modified,
                client_name: a.client_name,
                partitions: a.partitions,
                subscriptions: a.subscriptions,
                positions: a.positions,
                timed_out: a.timed_out,
            });
        }
        txns.sort_unstable_by_key(|t| t.seq);
        purge.sort_unstable_by_key(|p| (p.position, p.batch_index));
        Folded {
            strings: self.names.strings,
            pairs: self.names.pairs,
            txns,
            purge,
            max_seq: self.max_seq,
            records: self.records,
            live_records,
            foreign_records: self.foreign,
        }
    }
}

fn with_index(e: Error, pos: TxnPosition) -> Error {
    match e {
        Error::CorruptEntry { offset, reason, .. } => Error::CorruptEntry {
            position: Some(pos.position),
            offset,
            reason: format!("record {}: {reason}", pos.batch_index),
        },
        other => other,
    }
}

/// Folds every entry after the cursor's mark-delete (rewinding it first),
/// deleted batch indexes included as deleted.
pub fn fold_cursor(cursor: &Cursor, tc_id: u64) -> Result<Folded> {
    let mut folder = TxnLogFolder::new(tc_id);
    scan_cursor(cursor, |pos, entry, acks| {
        folder.push_entry(pos, entry, acks)
    })?;
    Ok(folder.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txnlog_record::Encode;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A record of a generated log: (op, seq, field payload, most_bits).
    #[derive(Debug, Clone)]
    struct Gen {
        op: i8,
        seq: u64,
        most: u64,
        status: i8,
        name: u8,
        time: u64,
        deleted: bool,
        timed_out: bool,
    }

    fn gen() -> impl Strategy<Value = Gen> {
        (
            0i8..4,
            0u64..12,
            prop_oneof![9 => Just(0u64), 1 => Just(1u64)],
            -1i8..5,
            0u8..4,
            0u64..1000,
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.2),
        )
            .prop_map(
                |(op, seq, most, status, name, time, deleted, timed_out)| Gen {
                    op,
                    seq,
                    most,
                    status,
                    name,
                    time,
                    deleted,
                    timed_out,
                },
            )
    }

    fn encode(g: &Gen) -> Vec<u8> {
        let name = format!("n{}", g.name);
        let parts = [name.as_str()];
        let subs = [("t", name.as_str())];
        let mut e = Encode {
            op: g.op,
            least_bits: g.seq,
            most_bits: g.most,
            last_modification_time: Some(g.time),
            ..Encode::default()
        };
        match g.op {
            OP_NEW => {
                e.new_status = Some(STATUS_OPEN);
                e.timeout_ms = Some(100 + g.time);
                e.start_time = Some(g.time / 2);
                e.max_local_txn_id = Some(g.seq);
                e.client_name = (g.name > 0).then_some(name.as_str());
            }
            OP_ADD_PARTITION => e.partitions = &parts,
            OP_ADD_SUBSCRIPTION => e.subscriptions = &subs,
            _ => {
                e.new_status = (g.status >= 0).then_some(g.status);
                e.timed_out = g.timed_out;
            }
        }
        e.encode()
    }

    type RefTxn = (
        i8,
        u64,
        u64,
        u64,
        Option<String>,
        Vec<String>,
        Vec<(String, String)>,
        usize,
        bool,
    );

    /// The obvious fold over prost-decoded messages.
    fn reference(log: &[Gen], bytes: &[Vec<u8>]) -> (BTreeMap<u64, RefTxn>, usize, Option<u64>) {
        use crate::proto::TransactionMetadataEntry;
        use prost::Message;
        let mut by_seq: BTreeMap<u64, Vec<TransactionMetadataEntry>> = BTreeMap::new();
        let mut max_seq = None;
        for (g, b) in log.iter().zip(bytes) {
            let m = TransactionMetadataEntry::decode(b.as_slice()).unwrap();
            if m.txnid_most_bits() != 0 {
                continue;
            }
            let top = m.max_local_txn_id().max(m.txnid_least_bits());
            max_seq = Some(max_seq.map_or(top, |x: u64| x.max(top)));
            if !g.deleted {
                by_seq.entry(m.txnid_least_bits()).or_default().push(m);
            }
        }
        let mut live = BTreeMap::new();
        let mut purge = 0;
        for (seq, ms) in by_seq {
            let status = ms
                .iter()
                .filter(|m| m.metadata_op == Some(3))
                .filter_map(|m| m.new_status)
                .max()
                .unwrap_or(0) as i8;
            let news: Vec<_> = ms.iter().filter(|m| m.metadata_op == Some(0)).collect();
            if news.is_empty() || status == 2 || status == 4 {
                purge += ms.len();
                continue;
            }
            let new = news[news.len() - 1];
            let timed_out = ms
                .iter()
                .any(|m| m.metadata_op == Some(3) && m.timed_out == Some(true));
            let mut parts: Vec<String> = Vec::new();
            let mut subs: Vec<(String, String)> = Vec::new();
            let mut modified = 0;
            for m in &ms {
                if m.metadata_op == Some(0) {
                    modified = modified.max(m.start_time());
                } else {
                    modified = modified.max(m.last_modification_time());
                }
                for p in &m.partitions {
                    if !parts.contains(p) {
                        parts.push(p.clone());
                    }
                }
                for s in &m.subscriptions {
                    let pair = (s.topic.clone(), s.subscription.clone());
                    if !subs.contains(&pair) {
                        subs.push(pair);
                    }
                }
            }
            let client = Some(new.client_name().to_owned()).filter(|c| !c.is_empty());
            live.insert(
                seq,
                (
                    status,
                    new.timeout_ms(),
                    new.start_time(),
                    modified,
                    client,
                    parts,
                    subs,
                    ms.len(),
                    timed_out,
                ),
            );
        }
        (live, purge, max_seq)
    }

    proptest! {
        #[test]
        fn fold_matches_reference(log in proptest::collection::vec(gen(), 0..120), per_entry in 1usize..6) {
            let bytes: Vec<Vec<u8>> = log.iter().map(encode).collect();
            let mut folder = TxnLogFolder::new(0);
            for (i, (g, b)) in log.iter().zip(&bytes).enumerate() {
                let pos = TxnPosition {
                    position: Position::new(3, (i / per_entry) as u64),
                    batch_size: per_entry as u32,
                    batch_index: (i % per_entry) as u32,
                };
                folder.push(b, pos, g.deleted).unwrap();
            }
            let f = folder.finish();
            let (want, purge, max_seq) = reference(&log, &bytes);
            prop_assert_eq!(f.max_seq, max_seq);
            prop_assert_eq!(f.purge.len(), purge);
            prop_assert_eq!(f.records as usize, log.len());
            let s = |id: u32| f.strings[id as usize].clone();
            let got: BTreeMap<u64, RefTxn> = f.txns.iter().map(|t| {
                let client = (t.client_name != NO_NAME).then(|| s(t.client_name));
                let parts = t.partitions.iter().map(|&p| s(p)).collect();
                let subs = t.subscriptions.iter().map(|&p| {
                    let (a, b) = f.pairs[p as usize];
                    (s(a), s(b))
                }).collect();
                (t.seq, (t.status, t.timeout_ms, t.start_time, t.last_modified, client, parts, subs, t.positions.len(), t.timed_out))
            }).collect();
            prop_assert_eq!(got, want);
            prop_assert!(f.txns.windows(2).all(|w| w[0].seq < w[1].seq));
            for t in &f.txns {
                prop_assert!(t.positions.windows(2).all(|w| (w[0].position, w[0].batch_index) < (w[1].position, w[1].batch_index)));
            }
        }
    }

    #[test]
    fn entry_with_ack_set_marks_deleted_and_checks_size() {
        let recs: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                Encode {
                    op: OP_NEW,
                    least_bits: i,
                    timeout_ms: Some(5),
                    ..Encode::default()
                }
                .encode()
            })
            .collect();
        let entry = crate::frame::encode_batch(&recs);
        let mut acks = AckSet::new(3).unwrap();
        acks.clear(1).unwrap();
        let mut f = TxnLogFolder::new(0);
        f.push_entry(Position::new(1, 7), &entry, Some(&acks))
            .unwrap();
        let out = f.finish();
        assert_eq!(out.txns.iter().map(|t| t.seq).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(out.max_seq, Some(2));
        assert_eq!(out.txns[1].positions[0].batch_index, 2);
        let wrong = AckSet::new(5).unwrap();
        let err = TxnLogFolder::new(0).push_entry(Position::new(1, 8), &entry, Some(&wrong));
        assert!(
            matches!(err, Err(Error::CorruptEntry { position: Some(p), .. }) if p == Position::new(1, 8))
        );
    }

    #[test]
    fn corrupt_record_names_position_and_unknown_status_is_rejected() {
        let entry = crate::frame::encode_batch(&[b"\x08\x00".as_slice(), b"\x32\x09ab"]);
        let err = TxnLogFolder::new(0).push_entry(Position::new(2, 4), &entry, None);
        match err {
            Err(Error::CorruptEntry {
                position, reason, ..
            }) => {
                assert_eq!(position, Some(Position::new(2, 4)));
                assert!(reason.starts_with("record 1"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let upd = Encode {
            op: OP_UPDATE,
            new_status: Some(9),
            ..Encode::default()
        }
        .encode();
        let single = TxnPosition::single(Position::new(2, 5));
        assert!(TxnLogFolder::new(0).push(&upd, single, false).is_err());
    }
}
