"""The Spark pipeline over txnstream's logs (``pip install txnstream[spark]``).

- :func:`session`: a SparkSession with the project's settings (``local[2]``
  by default, any master) and everything below registered;
- data source ``txnstream-log`` (:mod:`txnstream.spark.log_source`):
  coordinator and pending-ack logs, one row per record, read-only from the
  files of a live or closed data directory;
- data source ``txnstream`` (:mod:`txnstream.spark.topic_source`): topic
  messages, READ_COMMITTED or READ_UNCOMMITTED, batch and streaming, read-only
  from the files of a live or closed data directory;
- Arrow-batched UDFs over raw entries and ack sets (:mod:`txnstream.spark.udfs`);
- the audit job (:mod:`txnstream.spark.audit`, ``txnstream audit DATA_DIR``).

Data sources and SQL functions are registered per SparkSession: call
:func:`register` on a session made elsewhere.
"""

from __future__ import annotations

from txnstream.spark.log_source import TxnLogDataSource, pending_ack_log_name
from txnstream.spark.session import register, session
from txnstream.spark.topic_source import TopicDataSource

__all__ = ["TopicDataSource", "TxnLogDataSource", "pending_ack_log_name", "register", "session"]
