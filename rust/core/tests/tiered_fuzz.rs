//! Fuzzing of the tiered-storage decoders: arbitrary and mutated bytes never
//! panic, and whatever decodes re-encodes to the same bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use txnstream_core::tiered::{
    decode_frames, encode_segment, AbortedTxn, AbortedTxnIndex, SegmentIndex,
};
use txnstream_core::Position;

fn index_bytes(n: usize) -> Vec<u8> {
    let mut i = AbortedTxnIndex::new(3);
    for k in 0..n as u64 {
        i.append(AbortedTxn {
            txn: (1, k),
            first: Position::new(2, k),
            last: Position::new(3, 10 + k),
            last_stable: Position::new(2, k),
        })
        .unwrap();
    }
    i.encode()
}

fn segment(entries: &[Vec<u8>]) -> (Vec<u8>, Vec<u8>) {
    let (data, idx) = encode_segment(5, 0, entries.iter().map(|e| e.as_slice())).unwrap();
    (data, idx.encode())
}

proptest! {
    #[test]
    fn aborted_index_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(i) = AbortedTxnIndex::decode(&bytes) {
            prop_assert_eq!(i.encode(), bytes);
        }
    }

    #[test]
    fn mutated_aborted_index_is_rejected_or_identical(
        n in 0usize..6, at in any::<prop::sample::Index>(), bit in 0u8..8, cut in any::<prop::sample::Index>()
    ) {
        let good = index_bytes(n);
        let mut flipped = good.clone();
        let i = at.index(flipped.len());
        flipped[i] ^= 1 << bit;
        prop_assert!(AbortedTxnIndex::decode(&flipped).is_err());
        let c = cut.index(good.len());
        if let Ok(d) = AbortedTxnIndex::decode(&good[..c]) {
            prop_assert_eq!(d.encode(), good[..c].to_vec());
        }
    }

    #[test]
    fn segment_decoders_never_panic(
        entries in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8),
        at in any::<prop::sample::Index>(), bit in 0u8..8,
        junk in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let (data, idx) = segment(&entries);
        let back = SegmentIndex::decode(&idx).unwrap();
        let all = decode_frames(5, 0, &data).unwrap();
        prop_assert_eq!(all.len(), entries.len());
        let mut bad = idx.clone();
        let i = at.index(bad.len());
        bad[i] ^= 1 << bit;
        prop_assert!(SegmentIndex::decode(&bad).is_err());
        if !data.is_empty() {
            let mut bad = data.clone();
            let i = at.index(bad.len());
            bad[i] ^= 1 << bit;
            prop_assert!(decode_frames(5, 0, &bad).is_err() || back.split(0, &bad).is_err());
        }
        let _ = SegmentIndex::decode(&junk);
        let _ = decode_frames(5, 0, &junk);
    }
}
