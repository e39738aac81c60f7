"""The one SparkSession of the test suite (starting one costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from txnstream.spark import session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] SparkSession with txnstream's data sources and UDFs registered."""
    s = session("local[2]", app_name="txnstream-tests")
    yield s
    s.stop()
