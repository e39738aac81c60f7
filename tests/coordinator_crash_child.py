"""Child process for coordinator crash tests: kills itself (SIGKILL) at a named step.

Usage: python coordinator_crash_child.py DATA_DIR STEP ACTION

Opens coordinator 0 on DATA_DIR, ends one earlier transaction normally, opens
a bystander (left OPEN) and a victim, prints their ids as JSON, then ends the
victim with ACTION and SIGKILLs itself when the coordinator reports STEP for
it (see ``txnstream.testing.STEPS``). ACTION ``timeout``
gives the victim a short timeout and lets the timer abort it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from txnstream import testing
from txnstream.coordinator import TransactionCoordinator, TxnID
from txnstream.testing import RecordingParticipants


def main() -> None:
    data_dir, step, action = sys.argv[1:4]
    parts = RecordingParticipants()
    tc = TransactionCoordinator.open(
        data_dir, 0, participants=parts, transaction_meta_persist_count=10
    )
    earlier = tc.new_transaction(timeout_ms=600_000, client_name="crash-client")
    tc.add_produced_partitions(earlier, ["out-0"])
    tc.end_transaction(earlier, "commit")
    bystander = tc.new_transaction(timeout_ms=600_000, client_name="other")
    tc.add_produced_partitions(bystander, ["out-1"])
    victims: list[TxnID] = []

    def hook(name: str, txn: TxnID) -> None:
        if name == step and txn in victims:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    testing.set_step_hook(tc, hook)
    # A timeout must not fire before the partitions are added.
    timeout = 1_000 if action == "timeout" else 600_000
    victim = tc.new_transaction(timeout_ms=timeout, client_name="crash-client")
    victims.append(victim)
    tc.add_produced_partitions(victim, ["out-0", "out-1"])
    tc.add_acked_subscriptions(victim, [("in", "sub")])
    print(
        json.dumps(
            {
                "victim": victim.least_bits,
                "bystander": bystander.least_bits,
                "earlier": earlier.least_bits,
            }
        ),
        flush=True,
    )
    if action == "timeout":
        time.sleep(60)  # the timer aborts the victim; the hook kills us
    else:
        tc.end_transaction(victim, action)
    print("NOT KILLED", flush=True)
    tc.close()


if __name__ == "__main__":
    main()
