"""kbroker.perf: benchmarks and load tools.

``python -m kbroker.perf.broker_bench`` runs the foundation benchmark (kbroker beside Tansu and
librdkafka's mock cluster; see perf/README.md). ``harness`` holds the measurement plumbing and the
worker processes, ``targets`` starts and stops the brokers under test.
"""
