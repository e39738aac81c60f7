"""Child process for broker crash tests: a consume-transform-produce commit killed at STEP.

Usage: python broker_crash_child.py DATA_DIR STEP

Opens the broker on DATA_DIR (whose input topic ``in`` the parent seeded),
commits one transaction normally (input 0), then runs a victim transaction
(receive input 1, send its output, ack it) and SIGKILLs itself at STEP:

- ``before_commit``: the victim's sends and acks are durable, ``commit()``
  was not called (the first of the three durable waits is over);
- a coordinator step (``txnstream.testing.STEPS``): ``ending_logged`` (the
  decision is durable: the second wait), ``participants_done`` (markers and
  pending-ack COMMIT records durable: the third), ``terminated_stored``,
  ``final_logged`` (off the caller's path);
- ``after_commit``: ``commit()`` returned.

Prints the victim's transaction id as JSON before the kill.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from txnstream import Broker, testing
from txnstream.coordinator import TxnID

VICTIM_TIMEOUT_MS = 1_500


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    data_dir, step = sys.argv[1:3]
    broker = Broker.open(data_dir, registry=None)
    client = broker.client("crash-child")
    consumer = client.subscribe("in", "ctp")
    out = client.producer("out", name="ctp-out")

    with client.transaction() as earlier:
        msg = consumer.receive(5_000)
        assert msg is not None
        out.send(msg.value, txn=earlier)
        consumer.ack(msg, txn=earlier)

    victims: list[TxnID] = []

    def hook(name: str, txn: TxnID) -> None:
        if name == step and txn in victims:
            die()

    assert broker.coordinators is not None
    for tc in broker.coordinators.coordinators():
        testing.set_step_hook(tc, hook)
    txn = client.transaction(timeout_ms=VICTIM_TIMEOUT_MS)
    victims.append(txn.txn_id)
    msg = consumer.receive(5_000)
    assert msg is not None
    out.send(msg.value, txn=txn)
    consumer.ack(msg, txn=txn)
    print(json.dumps({"victim": [txn.txn_id.most_bits, txn.txn_id.least_bits]}), flush=True)
    if step == "before_commit":
        assert txn.wait_durable(10_000), "the victim's writes did not become durable"
        die()
    txn.commit()
    if step == "after_commit":
        die()
    print("NOT KILLED", flush=True)
    broker.close()


if __name__ == "__main__":
    main()
