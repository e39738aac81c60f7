//! Recovery fold of a coordinator's transaction log, in bulk (SPEC §4.3).
//!
//! The state machine lives in Python; folding a million log records into
//! the live transactions does not: Python would build an object per record
//! and per position. [`TxnLogFolder`] takes records in log order (with
//! their positions, and whether their batch index was already deleted) and
//! yields the live transactions with interned strings and flat positions,
//! plus the positions of records to purge.
//!
//! Rules (the Python reference fold in the tests follows the same ones):
//! only records of this coordinator (`most_bits == tc_id`) count; deleted
//! records only bound the sequence. UPDATE records are applied in log order
//! and each must be an allowed transition (SPEC §4.3: OPEN -> COMMITTING |
//! ABORTING, COMMITTING -> COMMITTED, ABORTING -> ABORTED, the same status
//! again is a no-op; OPEN may also go straight to a final status, whose
//! deciding record was deleted). A log in which one transaction takes both
//! the commit and the abort branch, or goes back, is a `CorruptEntry`
//! naming the record and the transaction: the coordinator never picks one
//! outcome silently. A transaction whose NEW record is gone, or whose
//! status is final, has ended: its remaining records are purged. Timeout,
//! start time and client name come from the NEW record; partitions and
//! subscriptions are the union in first-seen order; `last_modified` is the
//! largest of the start time and the non-NEW records' modification times;
//! `timed_out` is set when any UPDATE record carries the txnstream
//! `timed_out` extension (an abort by the timer).

use crate::ackset::AckSet;
use crate::error::{Error, Result};
use crate::ledger::Cursor;
use crate::position::{Position, TxnPosition};
use crate::replay::{entry_records, scan_cursor};
use crate::txnlog_record::{
    decode, OP_ADD_PARTITION, OP_ADD_SUBSCRIPTION, OP_NEW, OP_UPDATE, STATUS_ABORTED,
    STATUS_ABORTING, STATUS_COMMITTED, STATUS_COMMITTING, STATUS_OPEN,
};
use std::collections::{HashMap, HashSet};

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
    /// Interned partition names (distinct, first-seen order).
    pub partitions: Vec<u32>,
    /// Interned `(topic, subscription)` pairs (see [`Folded::pairs`]),
    /// distinct, first-seen order.
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
            status: STATUS_OPEN,
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
        let acc = self.txns.entry(r.least_bits).or_insert_with(Acc::new);
        if r.op == OP_UPDATE && r.new_status >= 0 {
            // Before any change: a refused transition leaves the folder as it was.
            check_transition(self.tc_id, r.least_bits, acc.status, r.new_status)
                .map_err(|reason| with_index(Error::corrupt_entry(0, reason), pos))?;
        }
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
            // Duplicates are dropped once, in `finish` (no scan per name).
            OP_ADD_PARTITION => {
                for p in &r.partitions {
                    acc.partitions.push(self.names.string(p));
                }
            }
            OP_ADD_SUBSCRIPTION => {
                for (t, s) in &r.subscriptions {
                    acc.subscriptions.push(self.names.pair(t, s));
                }
            }
            OP_UPDATE => {
                if r.new_status >= 0 {
                    acc.status = r.new_status;
                }
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
            let status = a.status;
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
                partitions: distinct(a.partitions),
                subscriptions: distinct(a.subscriptions),
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

/// `ids` without repeats, in first-seen order (one hash set, not a scan per id).
fn distinct(mut ids: Vec<u32>) -> Vec<u32> {
    if ids.len() > 1 {
        let mut seen = HashSet::with_capacity(ids.len());
        ids.retain(|id| seen.insert(*id));
    }
    ids
}

fn status_name(s: i8) -> &'static str {
    match s {
        STATUS_OPEN => "OPEN",
        STATUS_COMMITTING => "COMMITTING",
        STATUS_COMMITTED => "COMMITTED",
        STATUS_ABORTING => "ABORTING",
        STATUS_ABORTED => "ABORTED",
        _ => "UNKNOWN",
    }
}

/// Checks one UPDATE of transaction `(tc_id, seq)` from `cur` to `new`
/// (see the module rules); the error text names both and the transaction.
fn check_transition(tc_id: u64, seq: u64, cur: i8, new: i8) -> std::result::Result<(), String> {
    let commit = |s: i8| s == STATUS_COMMITTING || s == STATUS_COMMITTED;
    let abort = |s: i8| s == STATUS_ABORTING || s == STATUS_ABORTED;
    let ok = match cur {
        _ if cur == new => true,
        STATUS_OPEN => new != STATUS_OPEN && (STATUS_COMMITTING..=STATUS_ABORTED).contains(&new),
        STATUS_COMMITTING => new == STATUS_COMMITTED,
        STATUS_ABORTING => new == STATUS_ABORTED,
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let (a, b) = (status_name(cur), status_name(new));
    if (commit(cur) && abort(new)) || (abort(cur) && commit(new)) {
        Err(format!(
            "transaction ({tc_id},{seq}) has both a commit and an abort in its log ({a}, then {b})"
        ))
    } else if (0..=STATUS_ABORTED).contains(&new) {
        Err(format!(
            "transaction ({tc_id},{seq}) goes back from {a} to {b}"
        ))
    } else {
        Err(format!(
            "transaction ({tc_id},{seq}): unknown new_status {new}"
        ))
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
            (-1i8..5, 0i8..3, prop::bool::weighted(0.05)),
            0u8..4,
            0u64..1000,
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.2),
        )
            .prop_map(
                |(op, seq, most, (any, step, wild), name, time, deleted, timed_out)| {
                    // Mostly one branch per transaction (commit for even
                    // sequences): both valid logs and ones going back; now
                    // and then any status at all (branches mixed).
                    let status = match (wild, step) {
                        (true, _) => any,
                        (false, 0) => 0,
                        (false, k) if seq % 2 == 0 => k,
                        (false, k) => k + 2,
                    };
                    Gen {
                        op,
                        seq,
                        most,
                        status,
                        name,
                        time,
                        deleted,
                        timed_out,
                    }
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

    type RefFold = (BTreeMap<u64, RefTxn>, usize, Option<u64>);

    /// The obvious fold over prost-decoded messages: UPDATEs in log order,
    /// each checked against the transition table; `Err` for a bad one.
    fn reference(log: &[Gen], bytes: &[Vec<u8>]) -> std::result::Result<RefFold, ()> {
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
            let mut status = 0i32;
            for m in ms.iter().filter(|m| m.metadata_op == Some(3)) {
                let Some(new) = m.new_status else { continue };
                let allowed = new == status
                    || (status == 0 && (1..=4).contains(&new))
                    || (status == 1 && new == 2)
                    || (status == 3 && new == 4);
                if !allowed {
                    return Err(());
                }
                status = new;
            }
            let status = status as i8;
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
        Ok((live, purge, max_seq))
    }

    proptest! {
        #[test]
        fn fold_matches_reference(log in proptest::collection::vec(gen(), 0..120), per_entry in 1usize..6) {
            let bytes: Vec<Vec<u8>> = log.iter().map(encode).collect();
            let mut folder = TxnLogFolder::new(0);
            let mut failed = false;
            for (i, (g, b)) in log.iter().zip(&bytes).enumerate() {
                let pos = TxnPosition {
                    position: Position::new(3, (i / per_entry) as u64),
                    batch_size: per_entry as u32,
                    batch_index: (i % per_entry) as u32,
                };
                if let Err(e) = folder.push(b, pos, g.deleted) {
                    let at = match e {
                        Error::CorruptEntry { position, .. } => position,
                        _ => None,
                    };
                    prop_assert_eq!(at, Some(pos.position));
                    failed = true;
                    break;
                }
            }
            let Ok((want, purge, max_seq)) = reference(&log, &bytes) else {
                prop_assert!(failed, "the reference refused a transition the fold accepted");
                return Ok(());
            };
            prop_assert!(!failed, "the fold refused a transition the reference accepted");
            let f = folder.finish();
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
    fn corrupt_record_names_position_and_unknown_status_reads_as_absent() {
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
        // proto2 enums are closed: an UPDATE whose new_status is not a
        // TxnStatus reads as one without new_status (as protobuf reads it),
        // and changes no status; a known one going back is still refused.
        let new = Encode {
            op: OP_NEW,
            new_status: Some(STATUS_OPEN),
            ..Encode::default()
        }
        .encode();
        let update = |status| {
            Encode {
                op: OP_UPDATE,
                new_status: Some(status),
                ..Encode::default()
            }
            .encode()
        };
        let at = |e| TxnPosition::single(Position::new(2, e));
        let mut f = TxnLogFolder::new(0);
        f.push(&new, at(5), false).unwrap();
        f.push(&update(9), at(6), false).unwrap();
        f.push(&update(STATUS_ABORTING), at(7), false).unwrap();
        f.push(&update(-3), at(8), false).unwrap();
        assert!(f.push(&update(STATUS_OPEN), at(9), false).is_err());
        let out = f.finish();
        assert_eq!(out.txns.len(), 1);
        assert_eq!(out.txns[0].status, STATUS_ABORTING);
    }
}
