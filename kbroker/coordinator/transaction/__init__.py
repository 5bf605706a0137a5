"""The transaction coordinator (Kafka's KIP-98 protocol with KIP-360 epoch bumps) and ``__transaction_state``.

- ``records``: Kafka's key/value formats of ``__transaction_state`` (key v0, value v0/v1), encode and decode.
- ``metadata``: one transactional id's state and the state machine's legal moves.
- ``peers``: requests to other brokers (WriteTxnMarkers to leaders, KIP-890 verification to the
  coordinator), one pipelined client connection per broker.
- ``coordinator``: ``TransactionCoordinator``, the logic behind ``server/apis/transactions.py``: loading and
  unloading state partitions, InitProducerId, AddPartitions/AddOffsets, EndTxn and its markers, timeouts,
  expiration, Describe/ListTransactions.
"""
