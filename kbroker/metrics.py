"""Prometheus metrics under the names Kafka's JMX exporter produces (dashboards work unchanged), plus a
few of our own under ``kbroker_``. Served as text exposition format from a small asyncio HTTP server
on ``kbroker.metrics.port`` (``GET /metrics``).

Counters are plain integers bumped on the loop thread by the handlers; the endpoint renders them on
request, so collecting costs nothing on the data path beyond an addition per batch.
"""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


class BrokerMetrics:
    def __init__(self):
        self.messages_in: dict[str, int] = {}
        self.bytes_in: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}
        self.failed_produce: dict[str, int] = {}

    def produced(self, topic: str, records: int, nbytes: int) -> None:
        self.messages_in[topic] = self.messages_in.get(topic, 0) + records
        self.bytes_in[topic] = self.bytes_in.get(topic, 0) + nbytes

    def fetched(self, topic: str, nbytes: int) -> None:
        self.bytes_out[topic] = self.bytes_out.get(topic, 0) + nbytes

    def produce_failed(self, topic: str) -> None:
        self.failed_produce[topic] = self.failed_produce.get(topic, 0) + 1


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(broker) -> str:
    """The exposition text for one broker."""
    from .protocol.api import API_NAMES

    out: list[str] = []

    def metric(name, kind, helptext, samples):
        out.append(f"# HELP {name} {helptext}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
            out.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")

    def per_topic(counts):
        return [({}, sum(counts.values()))] + [({"topic": t}, n) for t, n in sorted(counts.items())]

    m = broker.metrics
    metric("kafka_server_brokertopicmetrics_messagesin_total", "counter",
           "Records appended (MessagesInPerSec)", per_topic(m.messages_in))
    metric("kafka_server_brokertopicmetrics_bytesin_total", "counter",
           "Record bytes appended (BytesInPerSec)", per_topic(m.bytes_in))
    metric("kafka_server_brokertopicmetrics_bytesout_total", "counter",
           "Record bytes returned by fetches (BytesOutPerSec)", per_topic(m.bytes_out))
    metric("kafka_server_brokertopicmetrics_failedproducerequests_total", "counter",
           "Partition appends that failed", per_topic(m.failed_produce))
    net = broker.server.metrics if broker.server else None
    if net is not None:
        metric("kafka_network_requestmetrics_requests_total", "counter", "Requests by API and version",
               [({"request": API_NAMES.get(k, str(k)), "version": v}, n) for (k, v), n in sorted(net.requests.items())])
        metric("kbroker_network_invalid_frames_total", "counter",
               "Connections closed for malformed or oversized frames", [({}, net.invalid_frames)])
        metric("kbroker_network_idle_closed_total", "counter",
               "Connections closed after connections.max.idle.ms", [({}, net.idle_closed)])
        metric("kbroker_network_fetch_sendfile_calls_total", "counter", "sendfile calls serving fetches",
               [({}, net.fetch_sendfile_calls)])
        metric("kbroker_network_fetch_sendfile_bytes_total", "counter", "Fetch bytes sent with sendfile",
               [({}, net.fetch_sendfile_bytes)])
        metric("kbroker_network_fetch_copy_bytes_total", "counter",
               "Fetch bytes sent through the copying path (tiny ranges)", [({}, net.fetch_copy_bytes)])
        metric("kafka_network_socketserver_connections", "gauge", "Open client connections",
               [({}, len(broker.server.connections))])
        metric("kbroker_network_request_pool_used_bytes", "gauge",
               "Request memory reserved from queued.max.request.bytes", [({}, broker.server.pool.used)])
    md = broker.metadata
    led = [(t, p) for t in md.topics.values() for p, i in t.partitions.items() if i.leader == broker.broker_id]
    metric("kafka_server_replicamanager_leadercount", "gauge", "Partitions this broker leads", [({}, len(led))])
    metric("kafka_server_replicamanager_partitioncount", "gauge", "Partitions with a replica here",
           [({}, sum(1 for t in md.topics.values() for i in t.partitions.values() if broker.broker_id in i.replicas))])
    rm = getattr(broker, "replica_manager", None)
    if rm is not None:
        # The replica manager's own view of the partitions it leads (its ISR is the one it acts on).
        metric("kafka_server_replicamanager_underreplicatedpartitions", "gauge",
               "Led partitions with ISR < replicas", [({}, rm.under_replicated())])
        metric("kafka_server_replicamanager_underminisrpartitioncount", "gauge",
               "Led partitions with ISR < min.insync.replicas", [({}, rm.under_min_isr())])
        metric("kafka_server_replicamanager_isrshrinks_total", "counter", "ISR shrinks by this leader (IsrShrinksPerSec)",
               [({}, rm.isr_shrinks)])
        metric("kafka_server_replicamanager_isrexpands_total", "counter", "ISR expansions by this leader (IsrExpandsPerSec)",
               [({}, rm.isr_expands)])
    else:
        metric("kafka_server_replicamanager_underreplicatedpartitions", "gauge", "Led partitions with ISR < replicas",
               [({}, sum(1 for t, p in led if len(t.partitions[p].isr) < len(t.partitions[p].replicas)))])
    controller = getattr(broker, "controller", None)
    active = controller is not None and controller.active
    metric("kafka_controller_kafkacontroller_activecontrollercount", "gauge", "1 on the active controller",
           [({}, 1 if active else 0)])
    # Reported by the active controller only (0 elsewhere), as Kafka's controller metrics are.
    metric("kafka_controller_kafkacontroller_offlinepartitionscount", "gauge",
           "Partitions without a live leader", [({}, controller.offline_partition_count() if active else 0)])
    metric("kafka_controller_controllerstats_leaderelectionrateandtimems_count", "counter",
           "Leader elections made by this broker's controller terms (LeaderElectionRateAndTimeMs)",
           [({}, controller.elections if controller is not None else 0)])
    if broker.logs is not None:
        metric("kafka_log_log_size", "gauge", "Partition size on disk in bytes",
               [({"topic": lg.topic, "partition": lg.partition}, lg.size_bytes) for lg in broker.logs.all_logs()])
        metric("kafka_log_log_logendoffset", "gauge", "Log end offset",
               [({"topic": lg.topic, "partition": lg.partition}, lg.log_end_offset) for lg in broker.logs.all_logs()])
    return "\n".join(out) + "\n"


class MetricsServer:
    """GET /metrics → exposition text; anything else → 404. One request per connection."""

    def __init__(self, broker, host: str, port: int):
        self.broker = broker
        self.host = host
        self.port = port
        self._server = None

    async def start(self):
        self._server = await asyncio.start_server(self._handle, self.host or None, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s:%d/metrics", self.host or "0.0.0.0", self.port)

    async def _handle(self, reader, writer):
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.split()
            if len(parts) >= 2 and parts[0] == b"GET" and parts[1].split(b"?")[0] == b"/metrics":
                body = render(self.broker).encode()
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            else:
                body = b"not found\n"
                head = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self):
        if self._server:
            self._server.close()
            await self._server.wait_closed()
