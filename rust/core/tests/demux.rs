//! SnapshotDemux over a real managed ledger: every entry read once whatever
//! the number of topics; snapshots written while recovery runs are seen.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use prost::Message;
use txnstream_core::demux::SnapshotDemux;
use txnstream_core::ledger::{LedgerOptions, ManagedLedger};
use txnstream_core::proto::CompactedRecord;

fn rec(key: &str, value: Option<&[u8]>) -> Vec<u8> {
    CompactedRecord {
        key: key.into(),
        value: value.map(<[u8]>::to_vec),
    }
    .encode_to_vec()
}

#[test]
fn each_entry_is_read_once_for_all_topics() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LedgerOptions {
        max_entries_per_ledger: 50,
        ..LedgerOptions::default()
    };
    let ml = ManagedLedger::open(
        dir.path(),
        "public/default/__transaction_buffer_snapshot",
        opts,
    )
    .unwrap();
    let topics = 40;
    for round in 0..3 {
        for t in 0..topics {
            ml.append(&rec(
                &format!("t{t}"),
                Some(format!("s{round}-{t}").as_bytes()),
            ))
            .unwrap();
        }
    }
    ml.append(&rec("t7", None)).unwrap(); // t7 deleted
    let mut d = SnapshotDemux::new();
    for t in (0..topics).rev() {
        let got = d.take(&ml, &format!("t{t}")).unwrap();
        if t == 7 {
            assert!(got.is_none());
        } else if t == 3 {
            // Written while recovery ran, before t3 asked: its newest.
            assert_eq!(got.unwrap().value.unwrap(), b"new-3".to_vec());
        } else {
            assert_eq!(got.unwrap().value.unwrap(), format!("s2-{t}").into_bytes());
        }
        if t == 20 {
            // A snapshot written while recovery runs: a waiting topic sees it,
            // a recovered one's is not kept.
            ml.append(&rec("t3", Some(b"new-3"))).unwrap();
            ml.append(&rec("t30", Some(b"new-30"))).unwrap();
        }
        if t == 3 {
            assert!(d.stats().entries_read > 121);
        }
    }
    let s = d.stats();
    assert_eq!(s.entries_read, 3 * topics + 1 + 2);
    assert_eq!(s.dropped, 1); // t30 had recovered already
    assert_eq!(s.answered, topics);
    assert_eq!(d.queued(), 0);
    assert!(d.take(&ml, "never").unwrap().is_none());
}

#[test]
fn compaction_under_an_open_reader_restarts_routing_and_drops_deleted_topics() {
    use txnstream_core::ledger::CompactedTopic;
    let dir = tempfile::tempdir().unwrap();
    let ct = CompactedTopic::open(
        dir.path(),
        "ns/__transaction_buffer_snapshot",
        LedgerOptions::default(),
    )
    .unwrap();
    for round in 0..2u8 {
        for t in 0..5 {
            ct.put(&format!("t{t}"), Some(&[round, t])).unwrap();
        }
    }
    let ml = ct.ledger().clone();
    let mut d = SnapshotDemux::new();
    assert_eq!(
        d.take(&ml, "t0").unwrap().unwrap().value.unwrap(),
        vec![1, 0]
    );
    // t1 deleted, then compaction drops the deletion and rewrites the rest.
    ct.put("t1", None).unwrap();
    ct.compact().unwrap();
    ct.put("t2", Some(&[9, 2])).unwrap();
    assert!(
        d.take(&ml, "t1").unwrap().is_none(),
        "a deleted topic answered an old snapshot"
    );
    assert_eq!(
        d.take(&ml, "t2").unwrap().unwrap().value.unwrap(),
        vec![9, 2]
    );
    assert_eq!(
        d.take(&ml, "t3").unwrap().unwrap().value.unwrap(),
        vec![1, 3]
    );
    assert!(d.stats().restarts >= 1);
    // Reading in bounded steps reaches the end too.
    let mut d2 = SnapshotDemux::new();
    let mut steps = 0;
    while !d2.catch_up_some(&ml, 1).unwrap() {
        steps += 1;
        assert!(steps < 100);
    }
    assert_eq!(d2.take_routed("t4").unwrap().value.unwrap(), vec![1, 4]);
}

#[test]
fn a_reopened_topic_answers_its_snapshot_written_after_reopening() {
    // A topic unloaded and loaded again in one broker asks the same demux a
    // second time: its newest snapshot (written at the unload) must be kept.
    let dir = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(
        dir.path(),
        "public/default/__transaction_buffer_snapshot",
        LedgerOptions::default(),
    )
    .unwrap();
    ml.append(&rec("a", Some(b"a-1"))).unwrap();
    let mut d = SnapshotDemux::new();
    assert_eq!(d.take(&ml, "a").unwrap().unwrap().value.unwrap(), b"a-1");
    ml.append(&rec("a", Some(b"a-2"))).unwrap();
    assert!(d.take(&ml, "a").unwrap().is_none()); // done: later records dropped
    d.reopen("a");
    ml.append(&rec("a", Some(b"a-3"))).unwrap();
    ml.append(&rec("b", Some(b"b-1"))).unwrap();
    assert_eq!(d.take(&ml, "a").unwrap().unwrap().value.unwrap(), b"a-3");
    assert_eq!(d.take(&ml, "b").unwrap().unwrap().value.unwrap(), b"b-1");
    d.reopen("never-asked"); // a topic that never asked: nothing changes
    assert!(d.take(&ml, "never-asked").unwrap().is_none());
}
