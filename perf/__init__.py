"""kbroker.perf: benchmarks and load tools.

``python -m kbroker.perf.broker_bench`` runs the foundation benchmark (kbroker beside Tansu and
librdkafka's mock cluster; see perf/README.md). ``harness`` holds the measurement plumbing and the
worker processes, ``targets`` starts and stops the brokers under test.

The load tools behind ``kbroker producer-perf-test`` / ``consumer-perf-test`` are ``producer_perf``
and ``consumer_perf`` (Kafka's output lines, number formats in ``java_format``). Only the pyperf
suites (``micro``, ``macro`` and their ``inputs`` and ``report``) import pyperf, so the load tools and
this package import without it.
"""
