"""Kafka record batches (RecordBatch v2): native codec plus compression."""
