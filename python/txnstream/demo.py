"""The main job behind ``make demo``.

At this stage it demonstrates the core codec on a realistic transaction log:
it builds PIP-160 batched entries of ``TransactionMetadataEntry`` records,
decodes them back in bulk through the Rust core and through the protobuf
package, checks that both agree, and prints what batching saves.
"""

from __future__ import annotations

import time

from txnstream import AckSet, frame, proto


def _records(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        ops = proto.TransactionMetadataEntry
        m = ops(
            metadata_op=ops.NEW if i % 4 == 0 else ops.UPDATE,
            txnid_most_bits=0,
            txnid_least_bits=i // 4,
            new_status=proto.OPEN if i % 4 == 0 else proto.COMMITTED,
            timeout_ms=30_000,
            last_modification_time=1_700_000_000_000 + i,
            client_name="demo",
        )
        out.append(m.SerializeToString())
    return out


def main() -> None:
    """Run the codec demonstration and print a short report."""
    records = _records(200_000)
    batch = 512
    entries = [frame.encode_batch(records[i : i + batch]) for i in range(0, len(records), batch)]
    unbatched_bytes = sum(len(r) + 8 for r in records)  # + per-entry ledger framing
    batched_bytes = sum(len(e) + 8 for e in entries)

    t0 = time.perf_counter()
    cols = frame.decode_txn_log_columns(entries)
    rust_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    least = []
    for e in entries:
        for m in proto.BatchedTransactionMetadataEntry.FromString(e[4:]).transaction_log:
            least.append(m.txnid_least_bits)
    upb_s = time.perf_counter() - t0
    assert least == cols["txnid_least_bits"].tolist(), "decoders disagree"

    acks = AckSet(batch)
    for i in range(0, batch, 2):
        acks.clear(i)

    print("txnstream codec demo")
    print(f"  records                 {len(records):>12,}")
    print(f"  entries unbatched       {len(records):>12,}   bytes {unbatched_bytes:>12,}")
    print(f"  entries batched (512)   {len(entries):>12,}   bytes {batched_bytes:>12,}")
    print(f"  Rust columnar decode    {len(records) / rust_s:>12,.0f} records/s")
    print(f"  protobuf (upb) + loop   {len(records) / upb_s:>12,.0f} records/s")
    print(f"  speed-up                {upb_s / rust_s:>12.1f}x")
    print(f"  ack set after deleting every other record: {acks.cardinality()} of {batch} present")


if __name__ == "__main__":
    main()
