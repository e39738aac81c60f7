//! Property tests: the ledger and its cursors against simple models, across
//! rollovers and reopens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use txnstream_core::ledger::{LedgerOptions, ManagedLedger};
use txnstream_core::{Position, TxnPosition};

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<u8>),
    AppendMany(Vec<Vec<u8>>),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec(any::<u8>(), 0..200).prop_map(Op::Append),
        2 => prop::collection::vec(prop::collection::vec(any::<u8>(), 0..50), 1..6)
            .prop_map(Op::AppendMany),
        1 => Just(Op::Reopen),
    ]
}

fn opts(max_entries: u64) -> LedgerOptions {
    LedgerOptions {
        max_entries_per_ledger: max_entries,
        preallocate_bytes: 64 << 10,
        ..LedgerOptions::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn ledger_matches_model(ops in prop::collection::vec(op(), 1..40), max_entries in 1u64..8) {
        let tmp = tempfile::tempdir().unwrap();
        let mut ml = ManagedLedger::open(tmp.path(), "p/q", opts(max_entries)).unwrap();
        let mut model: Vec<(Position, Vec<u8>)> = Vec::new();
        for op in ops {
            match op {
                Op::Append(d) => {
                    let p = ml.append(&d).unwrap();
                    model.push((p, d));
                }
                Op::AppendMany(ds) => {
                    let ps = ml.append_many(ds.clone()).unwrap();
                    prop_assert_eq!(ps.len(), ds.len());
                    // One append_many never spans two ledgers.
                    prop_assert!(ps.iter().all(|p| p.ledger_id == ps[0].ledger_id));
                    model.extend(ps.into_iter().zip(ds));
                }
                Op::Reopen => {
                    ml.close().unwrap();
                    ml = ManagedLedger::open(tmp.path(), "p/q", opts(max_entries)).unwrap();
                }
            }
        }
        for w in model.windows(2) {
            prop_assert!(w[0].0 < w[1].0);
        }
        prop_assert_eq!(ml.last_position(), model.last().map(|x| x.0));
        if let (Some(first), Some(last)) = (model.first(), model.last()) {
            prop_assert_eq!(ml.read_range(first.0, last.0).unwrap(), model.clone());
        }
        for (p, d) in &model {
            prop_assert_eq!(&ml.read(*p).unwrap(), d);
        }
    }
}

#[derive(Debug, Clone)]
enum CurOp {
    MarkDelete(usize),
    Delete(Vec<usize>),
    /// entry, batch size (2..6), index
    Batch(usize, u32, u32),
    Reopen,
}

fn cur_op() -> impl Strategy<Value = CurOp> {
    prop_oneof![
        2 => (0usize..30).prop_map(CurOp::MarkDelete),
        4 => prop::collection::vec(0usize..30, 1..5).prop_map(CurOp::Delete),
        4 => (0usize..30, 0u32..6).prop_map(|(e, i)| CurOp::Batch(e, 6, i)),
        1 => Just(CurOp::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn cursor_matches_model(ops in prop::collection::vec(cur_op(), 1..40)) {
        let tmp = tempfile::tempdir().unwrap();
        let mut ml = ManagedLedger::open(tmp.path(), "c", opts(7)).unwrap();
        let pos: Vec<Position> = (0..30u8).map(|i| ml.append(&[i]).unwrap()).collect();
        let mut cur = ml.open_cursor("s").unwrap();
        let mut deleted: BTreeSet<usize> = BTreeSet::new();
        let mut partial: BTreeMap<usize, BTreeSet<u32>> = BTreeMap::new();
        for op in ops {
            match op {
                CurOp::MarkDelete(i) => {
                    cur.mark_delete(pos[i]).unwrap();
                    let md = (0..30).take_while(|k| deleted.contains(k)).last();
                    if md.is_none_or(|m| i > m) {
                        deleted.extend(0..=i);
                    }
                }
                CurOp::Delete(is) => {
                    let ps: Vec<Position> = is.iter().map(|&i| pos[i]).collect();
                    cur.delete(&ps).unwrap();
                    deleted.extend(is);
                }
                CurOp::Batch(e, n, i) => {
                    let r = TxnPosition { position: pos[e], batch_size: n, batch_index: i };
                    cur.delete_batch_indexes(&[r]).unwrap();
                    if !deleted.contains(&e) {
                        let s = partial.entry(e).or_default();
                        s.insert(i);
                        if s.len() == n as usize {
                            deleted.insert(e);
                        }
                    }
                }
                CurOp::Reopen => {
                    cur.flush().unwrap();
                    ml.close().unwrap();
                    ml = ManagedLedger::open(tmp.path(), "c", opts(7)).unwrap();
                    cur = ml.open_cursor("s").unwrap();
                }
            }
            partial.retain(|e, _| !deleted.contains(e));
            for (k, p) in pos.iter().enumerate() {
                prop_assert_eq!(cur.is_deleted(*p), deleted.contains(&k), "entry {}", k);
                let want = partial.get(&k).map(|s| {
                    (0..6u32).filter(|i| !s.contains(i)).collect::<Vec<_>>()
                });
                let got = cur.batch_ack_set(*p).map(|a| a.present());
                prop_assert_eq!(got, want, "ack set of entry {}", k);
            }
            let prefix = (0..30).take_while(|k| deleted.contains(k)).last();
            prop_assert_eq!(cur.mark_delete_position(), prefix.map(|k| pos[k]));
        }
    }
}
