"""The embedded broker (SPEC §4.5): one data directory, its topics, subscriptions and logs.

:class:`Broker` owns the wiring; :class:`TopicName` parses Pulsar topic
names; :class:`Topic` is one partition (its transaction buffer,
deduplication and subscriptions).
"""

from __future__ import annotations

from txnstream.broker.broker import Broker
from txnstream.broker.topic import Topic
from txnstream.broker.topic_name import TopicName

__all__ = ["Broker", "Topic", "TopicName"]
