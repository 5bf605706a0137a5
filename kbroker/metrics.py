"""Prometheus metrics under the names Kafka's JMX exporter produces (dashboards work unchanged), plus a
few of our own under ``kbroker_``, served by prometheus-client (its WSGI app and threading server) on
``kbroker.metrics.port``, bound to the listener's host.

The counters are plain numbers bumped on the loop thread (BrokerMetrics here, NetworkMetrics in the
network server, the replica manager's, kbroker.request_metrics); nothing is registered per event.
``BrokerCollector`` reads them when scraped: the copying runs on the loop thread (one callback, so a
scrape never sees a dict the loop is resizing), the formatting on the scrape thread.

Kafka's RequestMetrics histograms (``*TimeMs``) are summaries as the JMX exporter writes them:
``quantile`` samples (0.50 ... 0.999) over roughly the last five minutes, like the decaying reservoir
behind Kafka's percentiles, with ``_count`` and ``_sum`` since start.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import socket
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import PlatformCollector, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry

from .request_metrics import LOOP_IDLE, N_BUCKETS, REQUEST_STATS, quantile

log = logging.getLogger(__name__)


class BrokerMetrics:
    def __init__(self):
        self.messages_in: dict[str, int] = {}
        self.bytes_in: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}     # the Fetch handler adds to it in its partition loop
        self.failed_produce: dict[str, int] = {}
        # Follower traffic, broker-wide as Kafka counts it (ReplicationBytesIn/OutPerSec): kept out of
        # BytesIn/BytesOut so that those stay the clients' traffic at any replication factor.
        self.replication_bytes_in = 0       # the replica fetcher adds what it appends
        self.replication_bytes_out = 0      # the Fetch handler adds what followers read

    def produced(self, topic: str, records: int, nbytes: int) -> None:
        self.messages_in[topic] = self.messages_in.get(topic, 0) + records
        self.bytes_in[topic] = self.bytes_in.get(topic, 0) + nbytes

    def produce_failed(self, topic: str) -> None:
        self.failed_produce[topic] = self.failed_produce.get(topic, 0) + 1


# Kafka's percentiles (Yammer histograms) and the quantile labels the JMX exporter gives them.
QUANTILES = (("0.50", 0.50), ("0.75", 0.75), ("0.95", 0.95), ("0.98", 0.98), ("0.99", 0.99), ("0.999", 0.999))
# Quantiles cover the requests since a snapshot at least WINDOW_S old (at most WINDOW_S + STEP_S).
WINDOW_S = 300.0
STEP_S = 30.0
# A scrape waits this long for the loop to hand over its counters.
SNAPSHOT_TIMEOUT_S = 10.0

_TIMES = ("RequestQueueTimeMs", "LocalTimeMs", "RemoteTimeMs", "ResponseSendTimeMs", "TotalTimeMs")


def _counter(name, doc, samples, labels=()):
    """``samples``: [(label values, value)]; an empty label tuple is the family's unlabelled total."""
    m = CounterMetricFamily(name, doc, labels=list(labels))
    for values, v in samples:
        m.add_sample(name + "_total", dict(zip(labels, values)), v)
    return m


def _gauge(name, doc, samples, labels=()):
    m = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, v in samples:
        m.add_sample(name, dict(zip(labels, values)), v)
    return m


def broker_snapshot(broker) -> dict:
    """The broker's counters as plain numbers, dict copies and tuples; runs on the loop thread, so it
    copies and counts only (about 3 ms per 10,000 partitions) and leaves the formatting to the scrape."""
    m = broker.metrics
    snap = {"messages_in": dict(m.messages_in), "bytes_in": dict(m.bytes_in), "bytes_out": dict(m.bytes_out),
            "failed_produce": dict(m.failed_produce),
            "replication": (m.replication_bytes_in, m.replication_bytes_out)}
    server = broker.server
    if server is not None:
        net = server.metrics
        snap["net"] = (dict(net.requests), net.invalid_frames, net.idle_closed, net.fetch_sendfile_calls,
                       net.fetch_sendfile_bytes, net.fetch_copy_bytes, len(server.connections), server.pool.used,
                       (net.reads.native, net.reads.reference))
        if server.tls_reads is not None:
            snap["tls_reads"] = (server.tls_reads.native, server.tls_reads.python)
    me = broker.broker_id
    led = hosted = under = 0
    for t in broker.metadata.topics.values():
        for i in t.partitions.values():
            if i.leader == me:
                led += 1
                under += len(i.isr) < len(i.replicas)
            hosted += me in i.replicas
    snap["leaders"], snap["partitions"] = led, hosted
    rm = getattr(broker, "replica_manager", None)
    if rm is not None:
        # The replica manager's own view of the partitions it leads (its ISR is the one it acts on).
        snap["rm"] = (rm.under_replicated(), rm.under_min_isr(), rm.isr_shrinks, rm.isr_expands,
                      rm.fenced_partitions())
        fast = getattr(rm, "fast", None)
        if fast is not None:
            snap["fast_produce"] = (fast.fast, fast.reference)
        fast = getattr(rm, "fast_fetch_handler", None)
        if fast is not None:
            snap["fast_fetch"] = (fast.fast, fast.reference)
            snap["fast_follower"] = (fast.follower_fast, fast.follower_polled, fast.follower_reference)
    else:
        snap["under_replicated"] = under
    controller = getattr(broker, "controller", None)
    active = controller is not None and controller.active
    snap["controller"] = (1 if active else 0, controller.offline_partition_count() if active else 0,
                          controller.elections if controller is not None else 0)
    if broker.logs is not None:
        snap["logs"] = [(lg.topic, lg.partition, lg.size_bytes, lg.log_end_offset) for lg in broker.logs.all_logs()]
    return snap


def broker_families(snap: dict) -> list[Metric]:
    """Everything except the request histograms, from ``broker_snapshot``; runs on the scrape thread."""
    from .protocol.api import API_NAMES

    out: list[Metric] = []

    def per_topic(counts):
        return [((), sum(counts.values()))] + [((t,), n) for t, n in sorted(counts.items())]

    out.append(_counter("kafka_server_brokertopicmetrics_messagesin", "Records appended (MessagesInPerSec)",
                        per_topic(snap["messages_in"]), ("topic",)))
    out.append(_counter("kafka_server_brokertopicmetrics_bytesin", "Record bytes appended (BytesInPerSec)",
                        per_topic(snap["bytes_in"]), ("topic",)))
    out.append(_counter("kafka_server_brokertopicmetrics_bytesout",
                        "Record bytes returned by fetches (BytesOutPerSec)", per_topic(snap["bytes_out"]), ("topic",)))
    repl_in, repl_out = snap["replication"]
    out.append(_counter("kafka_server_brokertopicmetrics_replicationbytesin",
                        "Record bytes appended by this broker's replica fetchers (ReplicationBytesInPerSec)",
                        [((), repl_in)]))
    out.append(_counter("kafka_server_brokertopicmetrics_replicationbytesout",
                        "Record bytes read by followers' fetches (ReplicationBytesOutPerSec)", [((), repl_out)]))
    out.append(_counter("kafka_server_brokertopicmetrics_failedproducerequests", "Partition appends that failed",
                        per_topic(snap["failed_produce"]), ("topic",)))
    if "net" in snap:
        requests, invalid, idle_closed, sf_calls, sf_bytes, copy_bytes, connections, pool_used, reads = snap["net"]
        out.append(_counter("kafka_network_requestmetrics_requests", "Requests by API and version",
                            [((API_NAMES.get(k, str(k)), str(v)), n) for (k, v), n in sorted(requests.items())],
                            ("request", "version")))
        out.append(_counter("kbroker_network_invalid_frames", "Connections closed for malformed or oversized frames",
                            [((), invalid)]))
        out.append(_counter("kbroker_network_idle_closed", "Connections closed after connections.max.idle.ms",
                            [((), idle_closed)]))
        out.append(_counter("kbroker_network_fetch_sendfile_calls", "sendfile calls serving fetches", [((), sf_calls)]))
        out.append(_counter("kbroker_network_fetch_sendfile_bytes", "Fetch bytes sent with sendfile", [((), sf_bytes)]))
        out.append(_counter("kbroker_network_fetch_copy_bytes", "Fetch bytes sent through the copying path (tiny ranges)",
                            [((), copy_bytes)]))
        out.append(_counter("kbroker_network_reads", "Readable events of client connections: served in one native "
                            "call (native) or by the connection's Python, the reference path (reference: a large "
                            "frame's own buffer, native_read off)", [(("native",), reads[0]), (("reference",), reads[1])],
                            ("path",)))
        out.append(_gauge("kafka_network_socketserver_connections", "Open client connections", [((), connections)]))
        out.append(_gauge("kbroker_network_request_pool_used_bytes",
                          "Request memory reserved from queued.max.request.bytes", [((), pool_used)]))
    if "tls_reads" in snap:
        out.append(_counter("kbroker_network_tls_reads", "Socket reads of TLS connections: records decrypted "
                            "natively (native) or through Python's ssl (python)",
                            [(("native",), snap["tls_reads"][0]), (("python",), snap["tls_reads"][1])], ("path",)))
    out.append(_gauge("kafka_server_replicamanager_leadercount", "Partitions this broker leads",
                      [((), snap["leaders"])]))
    out.append(_gauge("kafka_server_replicamanager_partitioncount", "Partitions with a replica here",
                      [((), snap["partitions"])]))
    if "rm" in snap:
        under, under_min_isr, shrinks, expands, fenced = snap["rm"]
        out.append(_gauge("kafka_server_replicamanager_underreplicatedpartitions", "Led partitions with ISR < replicas",
                          [((), under)]))
        out.append(_gauge("kbroker_replicamanager_selffencedpartitions",
                          "Partitions this broker stopped leading because its ZooKeeper session may have "
                          "expired, until a LeaderAndIsr settles them", [((), fenced)]))
        out.append(_gauge("kafka_server_replicamanager_underminisrpartitioncount",
                          "Led partitions with ISR < min.insync.replicas", [((), under_min_isr)]))
        out.append(_counter("kafka_server_replicamanager_isrshrinks", "ISR shrinks by this leader (IsrShrinksPerSec)",
                            [((), shrinks)]))
        out.append(_counter("kafka_server_replicamanager_isrexpands", "ISR expansions by this leader (IsrExpandsPerSec)",
                            [((), expands)]))
    else:
        out.append(_gauge("kafka_server_replicamanager_underreplicatedpartitions", "Led partitions with ISR < replicas",
                          [((), snap["under_replicated"])]))
    for key, name in (("fast_produce", "Produce"), ("fast_fetch", "Fetch")):
        if key in snap:
            fast, reference = snap[key]
            out.append(_counter(f"kbroker_{name.lower()}_native_requests",
                                f"{name} requests of the native request path: served without a Python frame "
                                "(fast) or by the Python handler, the reference path (reference)",
                                [(("fast",), fast), (("reference",), reference)],
                                ("path",)))
    if "fast_follower" in snap:
        served, polled, reference = snap["fast_follower"]
        out.append(_counter("kbroker_fetch_native_follower_requests",
                            "Followers' Fetch requests: answered natively (fast, also counted in "
                            "kbroker_fetch_native_requests path=fast), recorded natively and long-polled by Python "
                            "(polled) or left to the Python handler, the reference path (reference)",
                            [(("fast",), served), (("polled",), polled), (("reference",), reference)], ("path",)))
    active, offline, elections = snap["controller"]
    out.append(_gauge("kafka_controller_kafkacontroller_activecontrollercount", "1 on the active controller",
                      [((), active)]))
    # Reported by the active controller only (0 elsewhere), as Kafka's controller metrics are.
    out.append(_gauge("kafka_controller_kafkacontroller_offlinepartitionscount", "Partitions without a live leader",
                      [((), offline)]))
    # A Kafka timer: the JMX exporter writes its Count as a summary's ``_count``.
    timer = Metric("kafka_controller_controllerstats_leaderelectionrateandtimems",
                   "Leader elections made by this broker's controller terms (LeaderElectionRateAndTimeMs)", "summary")
    timer.add_sample("kafka_controller_controllerstats_leaderelectionrateandtimems_count", {}, elections)
    out.append(timer)
    if "logs" in snap:
        logs = snap["logs"]
        out.append(_gauge("kafka_log_log_size", "Partition size on disk in bytes",
                          [((t, str(p)), size) for t, p, size, _leo in logs], ("topic", "partition")))
        out.append(_gauge("kafka_log_log_logendoffset", "Log end offset",
                          [((t, str(p)), leo) for t, p, _size, leo in logs], ("topic", "partition")))
    return out


def request_snapshot() -> list[tuple[str, int, dict[str, tuple[list[int], float]]]]:
    """(request name, count, {Kafka time name: (bucket counts, sum seconds)}) per request type seen;
    runs on the loop thread (copies only)."""
    return [(s.name, s.count, {name: h.snapshot() for name, h in s.histograms().items()})
            for s in REQUEST_STATS.all()]


class _Windows:
    """Bucket-count snapshots over time, so quantiles describe recent requests only."""

    def __init__(self):
        self._lock = threading.Lock()      # concurrent scrapes
        self._history: collections.deque = collections.deque()   # (time, {(request, metric): counts})

    def base(self, now: float, current: dict) -> dict:
        """Counts at the start of the window (absent keys: zero) and record ``current`` if due."""
        with self._lock:
            h = self._history
            while len(h) >= 2 and h[1][0] <= now - WINDOW_S:
                h.popleft()
            base = h[0][1] if h and h[0][0] <= now - WINDOW_S else {}
            if not h or now - h[-1][0] >= STEP_S:
                h.append((now, current))
            return base


class BrokerCollector(Collector):
    """Reads one broker's counters at scrape time."""

    def __init__(self, broker):
        self.broker = broker
        self._windows = _Windows()

    def _on_loop(self, fn):
        loop = self.broker.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            return fn()
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            try:
                fut.set_result(fn())
            except BaseException as e:    # the scrape reports it
                fut.set_exception(e)

        loop.call_soon_threadsafe(run)
        return fut.result(SNAPSHOT_TIMEOUT_S)

    def collect(self):
        snap, requests = self._on_loop(lambda: (broker_snapshot(self.broker), request_snapshot()))
        yield from broker_families(snap)
        yield from self._request_families(requests, time.monotonic())
        yield _gauge("kafka_network_socketserver_networkprocessoravgidlepercent",
                     "Fraction of time the network (event loop) thread waited for I/O, since the previous "
                     "scrape at least a second ago", [((), LOOP_IDLE.ratio())])
        yield _counter("kbroker_network_loop_idle_seconds",
                       "Seconds the event loop waited for I/O (rate() of this is the idle fraction)",
                       [((), LOOP_IDLE.idle_seconds())])

    def _request_families(self, requests, now: float):
        current = {(name, metric): counts for name, _n, hists in requests for metric, (counts, _s) in hists.items()}
        base = self._windows.base(now, current)
        yield _counter("kafka_network_requestmetrics_requestspersec", "Requests answered (RequestsPerSec)",
                       [((name,), n) for name, n, _h in sorted(requests)], ("request",))
        zero = [0] * N_BUCKETS
        for metric in _TIMES:
            name = "kafka_network_requestmetrics_" + metric.lower()
            fam = Metric(name, f"{metric}: milliseconds per request ({_DOCS[metric]})", "summary")
            for request, _n, hists in sorted(requests):
                counts, sum_s = hists[metric]
                old = base.get((request, metric), zero)
                recent = [c - o for c, o in zip(counts, old)]
                for label, q in QUANTILES:
                    fam.add_sample(name, {"request": request, "quantile": label}, quantile(recent, q) * 1000.0)
                fam.add_sample(name + "_count", {"request": request}, sum(counts))
                fam.add_sample(name + "_sum", {"request": request}, sum_s * 1000.0)
            yield fam


_DOCS = {
    "RequestQueueTimeMs": "frame received until its handler starts",
    "LocalTimeMs": "handler running on the network thread",
    "RemoteTimeMs": "waiting for replicas, long polls or rebalances",
    "ResponseSendTimeMs": "response queued until its last byte is written",
    "TotalTimeMs": "frame received until the response is written",
}


class _Handler(WSGIRequestHandler):
    # A client that connects and stops sending frees its thread after this long (the server starts a
    # thread per connection; without a timeout idle sockets would hold threads forever).
    timeout = 5.0

    def log_message(self, format, *args):
        pass      # no line on stderr per scrape


class _Server(ThreadingWSGIServer):
    def handle_error(self, request, client_address):
        # Timed-out or reset scrapes: not worth a traceback on stderr each.
        log.debug("metrics request from %s failed", client_address, exc_info=True)


class MetricsServer:
    """prometheus-client's WSGI app over a registry of this broker's collector and the process's,
    served by prometheus-client's threading WSGI server on its own thread: ``GET /metrics`` (any
    path, as prometheus-client answers) -> exposition text."""

    def __init__(self, broker, host: str, port: int):
        self.broker = broker
        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker))
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds, python_info.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._httpd = None
        self._thread = None

    async def start(self):
        # An empty listener host means every interface, as for the Kafka listener.
        host = self.host or "0.0.0.0"
        family = socket.getaddrinfo(host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("MetricsHTTPServer", (_Server,), {"address_family": family})
        self._httpd = make_server(host, self.port, make_wsgi_app(self.registry), server_class, handler_class=_Handler)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kbroker-metrics", daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    async def stop(self):
        if self._httpd is not None:
            httpd, self._httpd = self._httpd, None
            # shutdown() waits for serve_forever's poll loop: off the loop, which a scrape may need.
            await asyncio.to_thread(httpd.shutdown)
            httpd.server_close()
