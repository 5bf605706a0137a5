"""One client connection to one broker: framing, pipelining, ApiVersions negotiation.

Requests are written as soon as they are made; Kafka answers on a connection in request order, so
the pending futures form a FIFO and each response must carry the correlation id at its head. A
mismatch means the stream is out of step: the connection is failed as a whole, as the Java client
does, rather than guessing which request an answer belongs to. A timed-out request fails the whole
connection too: its late answer would otherwise be matched against the next request.

Responses are received by an ``asyncio.BufferedProtocol``: the kernel writes a frame's body
straight into one buffer sized from its length prefix (one copy per byte, the kernel's), where
asyncio streams copied each byte three times (recv chunk, stream buffer, ``readexactly``). Only
the head of a frame that arrives with the previous one passes through a small staging buffer.
"""
from __future__ import annotations

import asyncio
import itertools
import struct
from collections import deque

from kbroker import __version__
from kbroker.protocol import api
from kbroker.protocol.errors import Errors
from kbroker.protocol.messages import API_NAMES, REQUESTS

_SIZE = struct.Struct(">i")
_CID_ERR = struct.Struct(">ih")
API_VERSIONS = 18
# The version we try first (KIP-511: v3 is the first flexible one and carries the client's name).
API_VERSIONS_FIRST = 3
MAX_FRAME = 256 * 1024 * 1024

# Versions this client can build and read, per API (further capped by the schema's range). The
# floors are what the code relies on: magic-2 batches need Produce 3+/Fetch 4+, Metadata 1+ has
# the null-means-all topics array, ListOffsets 1+ answers with a single offset.
CLIENT_VERSIONS: dict[int, tuple[int, int]] = {
    0: (3, 9),      # Produce
    1: (4, 12),     # Fetch (13+ names topics by id)
    2: (1, 7),      # ListOffsets
    3: (1, 12),     # Metadata
    8: (2, 7),      # OffsetCommit
    9: (1, 7),      # OffsetFetch (8+ batches groups)
    10: (0, 3),     # FindCoordinator (4+ batches keys)
    11: (0, 5),     # JoinGroup
    12: (0, 3),     # Heartbeat
    13: (3, 5),     # LeaveGroup (members[] form)
    14: (0, 3),     # SyncGroup
    15: (0, 4),     # DescribeGroups
    16: (0, 2),     # ListGroups
    18: (0, 3),     # ApiVersions
    19: (0, 7),     # CreateTopics
    20: (0, 5),     # DeleteTopics (6+ names topics by id)
    21: (0, 2),     # DeleteRecords
    22: (0, 4),     # InitProducerId
    24: (0, 3),     # AddPartitionsToTxn (4+ is broker to broker)
    25: (0, 3),     # AddOffsetsToTxn
    26: (0, 3),     # EndTxn
    27: (0, 1),     # WriteTxnMarkers (the transaction coordinator's)
    28: (0, 3),     # TxnOffsetCommit
    29: (1, 3),     # DescribeAcls (v1+: pattern types)
    30: (1, 3),     # CreateAcls
    31: (1, 3),     # DeleteAcls
    32: (0, 4),     # DescribeConfigs
    33: (0, 2),     # AlterConfigs
    34: (0, 2),     # AlterReplicaLogDirs
    35: (0, 4),     # DescribeLogDirs
    37: (0, 3),     # CreatePartitions
    42: (0, 1),     # DeleteGroups
    44: (0, 1),     # IncrementalAlterConfigs
    45: (0, 0),     # AlterPartitionReassignments
    46: (0, 0),     # ListPartitionReassignments
    47: (0, 0),     # OffsetDelete
    48: (0, 1),     # DescribeClientQuotas
    49: (0, 1),     # AlterClientQuotas
    60: (0, 2),     # DescribeCluster (v2: fenced brokers)
    61: (0, 0),     # DescribeProducers
    65: (0, 0),     # DescribeTransactions
    66: (0, 1),     # ListTransactions
}


class KafkaError(Exception):
    """A Kafka error code from a response. ``retriable`` follows Kafka's RetriableException set."""

    RETRIABLE = frozenset({
        Errors.CORRUPT_MESSAGE, Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.LEADER_NOT_AVAILABLE,
        Errors.NOT_LEADER_OR_FOLLOWER, Errors.REQUEST_TIMED_OUT, Errors.NETWORK_EXCEPTION,
        Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR,
        Errors.NOT_ENOUGH_REPLICAS, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        Errors.KAFKA_STORAGE_ERROR, Errors.FENCED_LEADER_EPOCH, Errors.UNKNOWN_LEADER_EPOCH,
        Errors.OFFSET_NOT_AVAILABLE, Errors.REPLICA_NOT_AVAILABLE, Errors.BROKER_NOT_AVAILABLE,
        Errors.CONCURRENT_TRANSACTIONS, Errors.THROTTLING_QUOTA_EXCEEDED,
        Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE,
    })
    # Errors that mean our metadata (who leads what) is stale.
    METADATA = frozenset({
        Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.LEADER_NOT_AVAILABLE, Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.FENCED_LEADER_EPOCH, Errors.UNKNOWN_LEADER_EPOCH, Errors.REPLICA_NOT_AVAILABLE,
        Errors.BROKER_NOT_AVAILABLE, Errors.KAFKA_STORAGE_ERROR,
    })

    def __init__(self, code: int, message: str | None = None, context: str | None = None):
        self.code = int(code)
        try:
            self.error = Errors(self.code)
            name = self.error.name
        except ValueError:
            self.error = None
            name = f"ERROR_{self.code}"
        self.name = name
        self.message = message
        self.context = context
        text = name
        if context:
            text = f"{context}: {text}"
        if message:
            text = f"{text}: {message}"
        super().__init__(text)

    @property
    def retriable(self) -> bool:
        return self.error in self.RETRIABLE

    @property
    def invalidates_metadata(self) -> bool:
        return self.error in self.METADATA


class KafkaConnectionError(KafkaError):
    """The connection failed or closed (Kafka's NetworkException: retriable, refresh metadata)."""

    def __init__(self, message: str):
        super().__init__(Errors.NETWORK_EXCEPTION, message)

    @property
    def invalidates_metadata(self) -> bool:
        return True


class RequestTimedOut(KafkaError):
    def __init__(self, message: str):
        super().__init__(Errors.REQUEST_TIMED_OUT, message)


class UnsupportedVersion(KafkaError):
    def __init__(self, message: str):
        super().__init__(Errors.UNSUPPORTED_VERSION, message)


def raise_for_error(code: int, message: str | None = None, context: str | None = None) -> None:
    if code:
        raise KafkaError(code, message, context)


class BrokerConnection:
    """An open, negotiated connection. Create with :meth:`open`."""

    def __init__(self, host: str, port: int, *, node_id: int = -1, client_id: str = "kbroker",
                 request_timeout_ms: int = 30000, client_versions=None, security=None):
        self.host, self.port, self.node_id = host, port, node_id
        self.security = security          # client.security.ClientSecurity; None: PLAINTEXT
        self.client_id = client_id
        self.request_timeout = request_timeout_ms / 1000
        self.client_versions = dict(CLIENT_VERSIONS if client_versions is None else client_versions)
        self.broker_versions: dict[int, tuple[int, int]] = {}
        self.api_versions_version = -1   # the ApiVersions version that succeeded
        self._transport: asyncio.Transport | None = None
        self._protocol: _ResponseProtocol | None = None
        self._pending: deque = deque()   # (correlation_id, api_key, version, future) in send order
        self._cids = itertools.count(1)
        self._closed_exc: Exception | None = None

    def __repr__(self) -> str:
        return f"<BrokerConnection node={self.node_id} {self.host}:{self.port}>"

    @classmethod
    async def open(cls, host: str, port: int, *, negotiate: bool = True, **kw) -> "BrokerConnection":
        conn = cls(host, port, **kw)
        loop = asyncio.get_running_loop()
        sec = conn.security
        tls = {} if sec is None or not sec.tls else {"ssl": sec.ssl_context, "server_hostname": host}
        try:
            conn._transport, conn._protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _ResponseProtocol(conn), host, port, **tls), conn.request_timeout)
        except (OSError, asyncio.TimeoutError) as e:   # ssl.SSLError (a failed handshake) is an OSError
            raise KafkaConnectionError(f"cannot connect to {host}:{port}: {e or 'timed out'}") from None
        try:
            if negotiate:
                await conn.negotiate()
            if sec is not None and sec.sasl:
                # ApiVersions may precede SASL; anything else is refused until it completed
                from .sasl import authenticate
                await authenticate(conn, sec)
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def closed(self) -> bool:
        return self._closed_exc is not None

    # ---- version negotiation ------------------------------------------------------------------

    async def negotiate(self) -> dict[int, tuple[int, int]]:
        """ApiVersions handshake (KIP-511): try v3; an UNSUPPORTED_VERSION answer is a v0 body that
        names the broker's ApiVersions range, so retry with its max (capped by ours), then with v0."""
        tried = []
        version = min(API_VERSIONS_FIRST, self.client_versions[API_VERSIONS][1])
        while True:
            tried.append(version)
            body = {"client_software_name": "kbroker", "client_software_version": __version__}
            resp = await self._request(API_VERSIONS, version, body)
            if resp["error_code"] == Errors.UNSUPPORTED_VERSION:
                theirs = {k["api_key"]: k["max_version"] for k in resp["api_keys"]}
                nxt = min(theirs.get(API_VERSIONS, 0), version - 1) if version > 0 else None
                if nxt is None or nxt < 0 or nxt in tried:
                    nxt = 0 if 0 not in tried else None
                if nxt is None:
                    raise UnsupportedVersion(f"{self}: no common ApiVersions version (tried {tried})")
                version = nxt
                continue
            raise_for_error(resp["error_code"], None, "ApiVersions")
            self.broker_versions = {k["api_key"]: (k["min_version"], k["max_version"])
                                    for k in resp["api_keys"]}
            self.api_versions_version = version
            return self.broker_versions

    def version_for(self, api_key: int) -> int:
        """Highest version both sides support; UnsupportedVersion if none."""
        ours = self.client_versions.get(api_key)
        valid = REQUESTS[api_key].valid
        theirs = self.broker_versions.get(api_key)
        if ours is None or theirs is None:
            raise UnsupportedVersion(f"{API_NAMES.get(api_key, api_key)} not supported by {self}")
        lo = max(ours[0], theirs[0], valid[0])
        hi = min(ours[1], theirs[1], valid[1])
        if lo > hi:
            raise UnsupportedVersion(
                f"{API_NAMES[api_key]}: client {ours} and broker {theirs} versions do not overlap")
        return hi

    def supports(self, api_key: int) -> bool:
        try:
            self.version_for(api_key)
            return True
        except UnsupportedVersion:
            return False

    # ---- requests -----------------------------------------------------------------------------

    async def send(self, api_key: int, body: dict, version: int | None = None,
                   expect_response: bool = True, timeout: float | None = None):
        """Send one request; -> (version, response dict), or (version, None) when no response
        is expected (acks=0 Produce)."""
        if version is None:
            version = self.version_for(api_key)
        if not expect_response:
            self._write(api_key, version, body, None)
            await self._drain()
            return version, None
        return version, await self._request(api_key, version, body, timeout)

    async def _request(self, api_key, version, body, timeout=None):
        fut = asyncio.get_running_loop().create_future()
        self._write(api_key, version, body, fut)
        await self._drain()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout or self.request_timeout)
        except asyncio.TimeoutError:
            exc = RequestTimedOut(f"{API_NAMES[api_key]} v{version} to {self} timed out")
            self._fail(exc)
            raise exc from None

    def _write(self, api_key, version, body, fut):
        if self._closed_exc is not None:
            raise KafkaConnectionError(f"{self} is closed: {self._closed_exc}")
        cid = next(self._cids) & 0x7FFFFFFF
        frame = api.encode_request(api_key, version, cid, self.client_id, body)
        if fut is not None:
            self._pending.append((cid, api_key, version, fut))
        self._transport.write(frame)

    async def _drain(self):
        waiter = self._protocol.drain_waiter()
        if waiter is not None:
            await waiter      # resolved by resume_writing, or failed with the connection's error

    def _frame(self, frame) -> bool:
        """One response frame (without its size): match it to the oldest request and complete
        that request's future. False when the connection failed on it."""
        size = len(frame)
        fut = None
        try:
            if not self._pending:
                raise KafkaConnectionError(f"{self}: response with no request outstanding")
            cid, api_key, version, fut = self._pending.popleft()
            got, code = _CID_ERR.unpack_from(frame, 0) if size >= 6 else (_SIZE.unpack_from(frame, 0)[0], 0)
            if got != cid:
                raise KafkaConnectionError(f"{self}: correlation id {got}, expected {cid}")
            if api_key == API_VERSIONS and code == Errors.UNSUPPORTED_VERSION:
                version = 0   # KIP-511: the error reply is always a v0 body
            try:
                # read-only: decoded fields (Fetch records) are views of the frame, as they were of bytes
                _, body = api.decode_response(api_key, version, memoryview(frame).toreadonly())
            except Exception as e:  # a body we cannot parse: the stream may be out of step
                if api_key == API_VERSIONS and code == Errors.UNSUPPORTED_VERSION:
                    # Some peers (librdkafka's mock) send an error body that is neither v0 nor
                    # flexible; the frame is whole, so just retry with v0 as KIP-511 allows.
                    if not fut.done():
                        fut.set_result({"error_code": code, "api_keys": []})
                    return True
                err = KafkaConnectionError(f"{self}: cannot decode {API_NAMES[api_key]} v{version}: {e}")
                if not fut.done():
                    fut.set_exception(err)
                raise err from None
            if not fut.done():
                fut.set_result(body)
            return True
        except KafkaError as e:
            if fut is not None and not fut.done():
                # the request this frame was taken for fails with the connection (it is no
                # longer pending, so _fail would not reach it and it would wait for its timeout)
                fut.set_exception(e)
                fut.exception()
            self._fail(e)
            return False

    def _fail(self, exc: Exception):
        if self._closed_exc is None:
            self._closed_exc = exc
        while self._pending:
            fut = self._pending.popleft()[3]
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()   # a caller that already gave up must not log "never retrieved"
        if self._protocol is not None:
            self._protocol.wake_writers(exc)
        if self._transport is not None:
            self._transport.close()

    def close(self):
        self._fail(KafkaConnectionError(f"{self} closed"))

    async def wait_closed(self):
        self.close()
        if self._protocol is not None:
            await self._protocol.lost


class _ResponseProtocol(asyncio.BufferedProtocol):
    """The receiving side of a BrokerConnection. Between frames the kernel fills ``stage``; once a
    frame's length prefix is known and the frame is not already whole in ``stage``, the kernel
    fills a buffer of exactly the frame's size (after the part ``stage`` already holds), and the
    frame is decoded from it. A frame that came whole with others is copied out of ``stage``
    (small answers: the next receive reuses ``stage``)."""

    STAGE = 64 * 1024

    def __init__(self, conn: BrokerConnection):
        self.conn = conn
        self.stage = bytearray(self.STAGE)
        self.start = self.end = 0       # stage[start:end] is received and not yet framed
        self.frame: bytearray | None = None
        self.got = 0                    # bytes of ``frame`` received
        self.paused = False
        self.writers: deque = deque()   # futures of _drain calls waiting for resume_writing
        self.lost = asyncio.get_running_loop().create_future()

    # ---- receiving ----------------------------------------------------------------------------

    def get_buffer(self, sizehint: int):
        if self.frame is not None:
            return memoryview(self.frame)[self.got:]
        if self.end == len(self.stage):   # a partial length prefix at the very end: move it down
            n = self.end - self.start
            self.stage[:n] = self.stage[self.start:self.end]
            self.start, self.end = 0, n
        return memoryview(self.stage)[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self.frame is not None:
            self.got += nbytes
            if self.got == len(self.frame):
                frame, self.frame = self.frame, None
                self.conn._frame(frame)
            return
        self.end += nbytes
        stage = self.stage
        while self.end - self.start >= 4 and self.conn._closed_exc is None:
            (size,) = _SIZE.unpack_from(stage, self.start)
            if size < 4 or size > MAX_FRAME:
                self.conn._fail(KafkaConnectionError(f"{self.conn}: bad response size {size}"))
                return
            body = self.start + 4
            have = self.end - body
            if have >= size:
                self.start = body + size
                if not self.conn._frame(bytes(memoryview(stage)[body:body + size])):
                    return
                continue
            # the rest of this frame goes straight into its own buffer
            frame = bytearray(size)
            frame[:have] = memoryview(stage)[body:self.end]
            self.frame, self.got = frame, have
            self.start = self.end = 0
            return
        if self.start == self.end:
            self.start = self.end = 0

    def eof_received(self):
        return False    # close; connection_lost fails what is pending

    def connection_lost(self, exc) -> None:
        conn = self.conn
        if exc is None:
            err = KafkaConnectionError(f"{conn}: connection closed by the broker")
        else:
            err = KafkaConnectionError(f"{conn}: {exc}")
        conn._fail(err)
        if not self.lost.done():
            self.lost.set_result(None)

    # ---- flow control of writes ---------------------------------------------------------------

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        while self.writers:
            fut = self.writers.popleft()
            if not fut.done():
                fut.set_result(None)

    def drain_waiter(self):
        """None when writes may go on; else a future resolved when the transport's buffer drains."""
        if self.conn._closed_exc is not None:
            exc = self.conn._closed_exc
            raise KafkaConnectionError(f"{self.conn}: write failed: {exc}")
        if not self.paused:
            return None
        fut = asyncio.get_running_loop().create_future()
        self.writers.append(fut)
        return fut

    def wake_writers(self, exc: Exception) -> None:
        while self.writers:
            fut = self.writers.popleft()
            if not fut.done():
                fut.set_exception(KafkaConnectionError(f"{self.conn}: write failed: {exc}"))
                fut.exception()
