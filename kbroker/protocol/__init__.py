"""Kafka wire protocol: primitive types, message schemas, framing and error codes.

Layering (the asyncpg protocol/codec split): ``types`` reads and writes primitives, ``schema`` turns a
declarative message definition into per-version encoder/decoder closures, ``messages`` holds our own
compact definitions of Kafka's request/response schemas, and ``api`` frames whole requests/responses.
"""
