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
