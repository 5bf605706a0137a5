"""Kafka's internal topics, named once for every layer (Kafka's ``org.apache.kafka.common.internals.Topic``).

Clients may read them but not produce to them or delete them; Metadata marks them ``is_internal``."""

GROUP_METADATA_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({GROUP_METADATA_TOPIC, TRANSACTION_STATE_TOPIC})
