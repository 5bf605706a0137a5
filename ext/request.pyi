"""Native request path (request.pyx and its includes): the Python-visible names, by include."""
from typing import Any

# ---- wire.pxi

PRODUCE_MIN: int
PRODUCE_MAX: int

class ProduceRequest:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[tuple[str, list[tuple[int, memoryview | None]]]]

def peek_key_version(frame: Any) -> tuple[int, int]: ...
def parse_produce(frame: Any) -> ProduceRequest: ...
def encode_produce_response(version: int, correlation_id: int, topics: list) -> bytes: ...

FETCH_MIN: int
FETCH_MAX: int

class FetchRequest:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int
    session_epoch: int
    topics: list[tuple[str | bytes, list[tuple[int, int, int, int, int]]]]   # v13+: ids until resolved
    ids: dict[str, bytes] | None            # v13+: name -> id of the known ids (set by the Fetch handler)
    unknown: list[tuple[bytes, list[int]]] | None   # v13+: the ids this broker does not know
    forgotten: list[tuple[str | bytes, list[int]]]  # v7+: forgotten_topics_data
    recorded: bool          # a follower's fetch whose positions the native path recorded (long poll only)
    frame: bytes | None     # a recorded fetch's frame (FastFetch.reread)
    rack_id: str

def parse_fetch(frame: Any) -> FetchRequest: ...
def encode_fetch_response(version: int, correlation_id: int, error_code: int, topics: list,
                          inline_max: int, ids: dict[str, bytes] | None = None,
                          session_id: int = 0) -> tuple[list, int]: ...

# ---- reqstats.pxi
BOUNDS_S: tuple[float, ...]
N_BUCKETS: int

class TimeHistogram:
    counts: list[int]
    sum_s: float
    def snapshot(self) -> tuple[list[int], float]: ...

class RequestStats:
    name: str
    count: int
    queue: TimeHistogram
    local: TimeHistogram
    remote: TimeHistogram
    send: TimeHistogram
    total: TimeHistogram
    def __init__(self, name: str) -> None: ...
    def observe(self, queue_s: float, local_s: float, send_s: float, total_s: float) -> None: ...
    def histograms(self) -> dict[str, TimeHistogram]: ...

# ---- slots.pxi
def bind_request_stats(by_key: dict[int, RequestStats], get: Any) -> None: ...

class Slot:
    header: Any
    api_key: int
    chunks: Any
    done: bool
    follower: bool
    since: float
    arrived: float
    started: float
    local: float
    queued: float
    lost: dict[tuple[str, int], str] | None
    def __init__(self, header: Any, since: float, arrived: float) -> None: ...
    def observe(self, sent: float) -> None: ...

def observe_slots(slots: list[Slot], sent: float) -> None: ...

def begin_native(frame: Any, parse: Any, pending: Any, counts: dict[tuple[int, int], int], since: float,
                 arrived: float) -> Slot: ...
def end_native(slot: Slot, result: Any, no_response: object, close: object) -> bool: ...
# ---- lost.pxi
def lost_answer(slot: Slot, chunks: Any, no_response: Any, close: Any) -> Any: ...

# ---- conn.pxi
def dispatch_frames(conn: Any, chunk: Any, start: int, end: int, max_frame: int, produce: Any, fetch: Any,
                    supported: dict[int, tuple[int, int]], no_response: object, close: object) -> int: ...
def take_answers(pending: Any, out: list[Any], answered: list[Slot], no_response: object) -> None: ...

class ConnState:
    """The connection's fields every read touches (C fields; kbroker.network.connection.Connection's base)."""
    transport: Any
    server: Any
    loop: Any
    closed: bool
    last_active: float
    partial_since: float | None

class ReadStats:
    """Readable events served by on_read (native) and by the connection's Python (the reference path)."""
    native: int
    reference: int

def bind_read(supported: dict[int, tuple[int, int]], no_response: object, close: object, min_tail: int) -> None: ...
def next_buffer(conn: Any, sizehint: int) -> Any: ...
def on_read(conn: Any, nbytes: int) -> None: ...
def recv_ready(conn: Any) -> None: ...

# ---- produce_path.pxi
class FastLeader:
    """A partition this broker leads, armed for the native Produce path (ReplicaManager._fast_refresh)."""
    partition: Any
    log: Any
    config: Any
    tp: tuple[str, int]
    follower_key: tuple
    epoch_cache: Any
    def __init__(self, tp: tuple[str, int], partition: Any, log: Any, ap: Any, config: Any, epoch: int,
                 alone: bool, followers: bool, follower_key: tuple, waiters: Any,
                 tails: dict, epoch_cache: Any, park: bool = False) -> None: ...

class FastProduce:
    """The Produce handler of the native request path: armed partitions served inside dispatch_frames,
    everything else by ``reference_path(conn, req)`` (produce.handle_native)."""
    fast: int
    reference: int
    def __init__(self, reference_path: Any, rearm: Any, write_failed: Any, leaders: dict, messages_in: dict[str, int],
                 bytes_in: dict[str, int], notify: dict, appended: Any, failing_dirs: dict, big: int,
                 off_loop: bool, produce_failed: Any = None) -> None: ...
    def __call__(self, conn: Any, req: ProduceRequest) -> Any: ...

class ParkedProduce:
    """An acks=-1 Produce the native path appended and parked until the high watermark covers it (a
    ``Partition.waiters`` entry, DelayedProduce's protocol); ``future`` resolves to the encoded answer."""
    future: Any
    timer: Any
    remaining: int
    def decide(self, tp: tuple[str, int], error_code: int) -> None: ...
    def expire(self) -> None: ...
    def undecided(self) -> list[tuple[str, int]]: ...

def arm_leader(leaders: dict, leader: FastLeader) -> None:
    """Serve ``leader.tp`` natively (its slot in the shared ``leaders`` dict replaced)."""

def disarm_leader(leaders: dict, tp: tuple[str, int]) -> None:
    """``tp`` takes the reference path."""

# ---- fetch_path.pxi
class FastFetch:
    """The Fetch handler of the native request path: the consumer's small one-partition Fetch of an
    armed partition served inside dispatch_frames, everything else by ``reference_path(conn, req)``
    (fetch.handle_native)."""
    fast: int
    reference: int
    follower_fast: int      # followers' fetches answered natively
    follower_polled: int    # followers' fetches recorded natively, long-polled by ``reference_path``
    follower_reference: int      # followers' fetches left whole to ``reference_path``
    def __init__(self, reference_path: Any, rearm: Any, leaders: dict, bytes_out: dict[str, int],
                 config_values: dict, blocks: Any, local_id: int, topic_configs: dict, complete: Any,
                 broker_metrics: Any) -> None: ...
    def reread(self, conn: Any, frame: bytes) -> list | None:
        """A long poll's read of a recorded follower fetch -> [chunks, records' size] or None (Python)."""
    def __call__(self, conn: Any, req: FetchRequest) -> Any: ...
