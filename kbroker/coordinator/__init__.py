"""Group coordinator (classic protocol) and the ``__consumer_offsets`` store.

- ``records``: Kafka's record formats for ``__consumer_offsets`` (offset commit key v1 / value v3,
  group metadata key v2 / value v3), encode and decode.
- ``group``: one group's members and state machine (Empty, PreparingRebalance, CompletingRebalance,
  Stable, Dead).
- ``store``: appends to and loads from the offsets partitions (the single append entry point).
- ``group_coordinator``: ``GroupCoordinator``, the request logic behind the thin handlers in
  ``server/apis/groups.py``: joins, syncs, heartbeats, commits.
- ``ownership``: which internal partitions this broker leads, loading and unloading them
  (``PartitionLoader``, shared with the transaction coordinator), the coordinators' periodic tasks.
"""
