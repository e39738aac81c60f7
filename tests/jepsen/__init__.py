"""Jepsen-style checking of txnstream's transactional log.

- :mod:`tests.jepsen.history`: the operations a consume-transform-produce workload
  records (typed dataclasses) and their JSON-lines form, which a worker process can
  append to while it runs and a parent can read after a kill -9.
- :mod:`tests.jepsen.checker`: decides the anomalies of
  ``shared/reference/jepsen-checker.md`` from a history and reports each with its
  evidence.
- :mod:`tests.jepsen.workload`: the consume-transform-produce worker and the final
  read phase, written against the client API shapes of SPEC §4.9.
"""
