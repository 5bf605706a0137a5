"""One broker process: starts storage, ZooKeeper session, metadata and the network server, in that
order, and stops them in reverse with a clean-shutdown marker so the next start needs no log scan.

Threads: everything runs on one asyncio loop; blocking ZooKeeper calls go to worker threads
(``asyncio.to_thread``) and their results are applied on the loop. Native byte work releases the GIL.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import signal
import time

from ..config import BrokerConfig, ConfigError, parse_topic_config
from ..log.manager import LogManager
from ..metrics import BrokerMetrics, MetricsServer
from ..network.server import KafkaServer, Listener
from ..security import tls
from ..security.tlsreload import SECURE as TLS_PROTOCOLS, DynamicTls
from ..security.sasl.scram import ScramCredential
from ..security.sasl.server import SUPPORTED as SASL_SUPPORTED, SaslListener
from ..client.security import ClientSecurity, jaas_options
from ..zk.credentials import get_user_config
from ..protocol import api
from ..request_metrics import LOOP_IDLE
from ..replica import ReplicaManager
from ..controller.controller import Controller
from ..zk.client import BrokerZk, kazoo_tls
from ..zk.layout import CONFIG_CHANGES
from ..security.authorizer import AclAuthorizer
from .fetch_sessions import FetchSessionCache
from .metadata import BrokerInfo, MetadataCache, TopicInfo

log = logging.getLogger(__name__)

# The API table: advertised versions (api.SUPPORTED) and handlers, declared once.
from . import apis  # noqa: E402
from .apis import authz as authz_api  # noqa: E402
from .apis import fetch as fetch_api  # noqa: E402
from .apis import produce as produce_api  # noqa: E402
from .apis.producer_ids import ProducerIdAllocator  # noqa: E402
from .apis.quotas import Throttling  # noqa: E402
from ..security.quotas import QuotaManager  # noqa: E402
from ..coordinator.group_coordinator import GroupCoordinator  # noqa: E402
from ..coordinator.transaction.coordinator import TransactionCoordinator  # noqa: E402


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.broker_id = config.broker_id
        self.cluster_id: str | None = None
        self.metadata = MetadataCache()
        # how this broker connects to the others' inter-broker listener (replica fetchers, controller
        # channel, controlled shutdown): that listener's protocol and ssl.* values
        inter = config.inter_broker_listener
        mechanism = config.get("sasl.mechanism.inter.broker.protocol")
        self.inter_broker_security = ClientSecurity.from_lookup(
            functools.partial(config.listener_get, inter.listener_name), inter.security_protocol, mechanism,
            config.listener_get(inter.listener_name, f"{mechanism.lower()}.sasl.jaas.config") or "")
        self.logs: LogManager | None = None
        self.replica_manager: ReplicaManager | None = None
        self.zk: BrokerZk | None = None
        self.controller: Controller | None = None   # active while this broker holds /controller
        self.self_fenced = False    # stepped down: ZooKeeper may have expired our session (_session_fence)
        self._config_change_seq: int | None = None   # last /config/changes notification applied
        self.server: KafkaServer | None = None
        self.notifier = None
        # KIP-227's incremental fetch sessions (server/fetch_sessions.py): built at start, closed at stop
        self.fetch_sessions: FetchSessionCache | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        # The periodic checkpoint files' fsyncs run here, off the loop (LogManager docstring).
        self._checkpoint_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        self._stopped = asyncio.Event()
        self.fatal = None           # why the broker stopped itself (exit code 1), e.g. every log dir failed
        self.request_stop = None    # set by the process: stop the broker as SIGTERM would
        self.metrics = BrokerMetrics()
        self.metrics_server: MetricsServer | None = None
        self._metadata_lock = asyncio.Lock()
        self.group_coordinator = GroupCoordinator(self)
        self.producer_ids = ProducerIdAllocator(self)
        self.txn_coordinator = TransactionCoordinator(self)
        self.handlers: dict = apis.dispatch(self)    # api key -> handler(conn, header, body)
        # authorizer.class.name: None = every request allowed (no per-request work anywhere)
        self.authorizer: AclAuthorizer | None = AclAuthorizer.from_config(config.get)
        self.quotas = Throttling(self, QuotaManager.from_config(config.get))   # client quotas

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        from .notify import AppendNotifier

        self.loop = asyncio.get_running_loop()
        LOOP_IDLE.install(self.loop)     # NetworkProcessorAvgIdlePercent
        self.notifier = AppendNotifier()
        cfg = self.config
        self.fetch_sessions = FetchSessionCache(cfg.get("max.incremental.fetch.session.cache.slots"),
                                                self.notifier.waiters, self.loop,
                                                cfg.get("replica.lag.time.max.ms") // 4)
        self.fetch_sessions.start()
        if self.broker_id < 0:
            raise RuntimeError("broker.id must be set (automatic broker id generation is not implemented)")
        try:
            zk_tls = kazoo_tls(cfg.get)
        except ValueError as e:
            raise ConfigError(str(e), str(e).split(":", 1)[0]) from None
        secure = cfg.get("zookeeper.set.acl")
        digest = cfg.get("kbroker.zookeeper.digest.credentials") if secure else None
        # As Kafka: the znodes' ACLs name the identity this broker has in ZooKeeper, its TLS client
        # certificate (ZooKeeper's x509 scheme) or its digest credentials; without either there is none.
        if secure and not digest and not (zk_tls and zk_tls.get("certfile")):
            raise ConfigError("zookeeper.set.acl=true needs an identity in ZooKeeper: a TLS client certificate "
                              "(zookeeper.ssl.client.enable=true with zookeeper.ssl.keystore.location) or "
                              "kbroker.zookeeper.digest.credentials=user:password", "zookeeper.set.acl")
        self.zk = BrokerZk(cfg.zookeeper_connect, self.broker_id, cfg.zookeeper_session_timeout_ms,
                           loop=self.loop, connect_timeout_s=cfg.zookeeper_connection_timeout_ms / 1000,
                           digest=digest, tls=zk_tls, secure_acls=bool(secure))
        self.zk.on_reregistered = lambda epoch: log.info("re-registered in ZooKeeper, broker epoch %d", epoch)
        self.zk.on_session_lost = lambda: log.warning("ZooKeeper session expired; re-registering")
        self.zk.on_controller_change = self._on_controller_change
        await asyncio.to_thread(self.zk.start)
        self.cluster_id = self.zk.cluster_id
        if self.authorizer is not None:
            # ACLs before the listener opens: no request is decided on an empty cache
            self.authorizer.on_change.append(self._acls_changed)
            await asyncio.to_thread(self.authorizer.start, self.zk.kazoo, self.loop,
                                    lambda fn, *args: self.loop.call_soon_threadsafe(fn, *args))
        await asyncio.to_thread(self.quotas.start)     # client quotas, too, before the listener opens
        log.info("cluster id %s", self.cluster_id)
        # Topic configs come from ZooKeeper before the logs load, so recovery and retention use them.
        configs = await asyncio.to_thread(self._read_topic_configs, None)
        # hw_follows_leo=False: each partition's leader moves its high watermark (ISR rule).
        self.logs = LogManager(cfg.log_dirs, cfg.topic_defaults(), cleaner_config=cfg.cleaner_config(),
                               hw_follows_leo=False)
        self.logs.startup(self.broker_id, self.cluster_id,
                          {name: self._typed(c) for name, c in configs.items()})
        self.replica_manager = ReplicaManager(self)
        if cfg.get("transaction.partition.verification.enable"):
            self.replica_manager.txn_verifier = self.txn_coordinator.verify_for_leader
        self.replica_manager.start()
        watcher = self.replica_manager.throttle_watcher
        if watcher is not None:     # dynamic connection creation rates follow /config/brokers too
            watcher.on_reload.append(self.quotas.apply_broker_configs)
            await watcher.reload()      # applied before the listeners open
        self.logs.on_dir_failure = self._log_dir_failed

        # The TLS listeners' keystores as AlterConfigs last set them for this broker (a restart keeps them).
        self.dynamic_tls = DynamicTls(cfg)
        secure = [(e.listener_name, e.security_protocol) for e in cfg.listeners]
        if any(p in TLS_PROTOCOLS for _, p in secure):
            stored = await asyncio.to_thread(self.zk.get_broker_config, str(self.broker_id))
            self.dynamic_tls.load(secure, stored)
        listener = cfg.listeners[0]
        self.server = KafkaServer(
            listener.host, listener.port, self.handlers,
            listeners=[self._listener(e) for e in cfg.listeners],
            max_request_bytes=cfg.get("socket.request.max.bytes"),
            pool_bytes=self._pool_bytes(),
            idle_ms=cfg.get("connections.max.idle.ms"),
            send_buffer_bytes=cfg.get("socket.send.buffer.bytes"),
            receive_buffer_bytes=cfg.get("socket.receive.buffer.bytes"),
            max_connections=cfg.get("max.connections"),
            max_connections_per_ip=cfg.get("max.connections.per.ip"),
            frame_timeout_ms=cfg.get("kbroker.socket.request.frame.timeout.ms"),
            authorizing=self.authorizer is not None,
            quotas=self.quotas,
            # Produce v3-11 and Fetch v4-17 parsed and answered natively (same policy as the table's
            # handlers: kbroker/server/apis/produce.py, fetch.py).
            # The common one-partition Produce is served without a Python frame (ReplicaManager.fast_produce).
            native_handlers={int(api.ApiKey.PRODUCE): self.replica_manager.fast_produce(
                                 functools.partial(produce_api.handle_native, self),
                                 functools.partial(produce_api.fast_write_failed, self)),
                             # and the consumer's small one-partition Fetch (ReplicaManager.fast_fetch).
                             int(api.ApiKey.FETCH): self.replica_manager.fast_fetch(
                                 functools.partial(fetch_api.handle_native, self))},
        )
        await self.server.start()
        bound = {l.name: l.port for l in self.server.listeners}
        # every advertised endpoint, a port 0 replaced by the port its listener bound
        self.endpoints = [(e.listener_name, e.host or "127.0.0.1", e.port or bound[e.listener_name])
                          for e in cfg.advertised_listeners]
        inter = cfg.inter_broker_listener.listener_name
        self.metadata.inter_broker_listener = inter
        _, self.advertised_host, self.advertised_port = next(e for e in self.endpoints if e[0] == inter)
        protocols = {e.listener_name: e.security_protocol for e in cfg.advertised_listeners}

        # Until the controller's first UpdateMetadata this broker knows only itself.
        self.metadata.brokers = {self.broker_id: BrokerInfo(
            self.broker_id, self.advertised_host, self.advertised_port, cfg.get("broker.rack"),
            {name: (host, port) for name, host, port in self.endpoints})}
        # Registration, then the election (as Kafka): the controller finds us among the live brokers
        # and sends us the cluster's metadata over the listener that is already open.
        epoch = await asyncio.to_thread(functools.partial(
            self.zk.register_broker, self.advertised_host, self.advertised_port, cfg.get("broker.rack"),
            endpoints=self.endpoints, security_protocol_map=protocols))
        log.info("registered broker %d at %s (inter-broker listener %s, broker epoch %d)", self.broker_id,
                 ", ".join(f"{n}://{h}:{p}" for n, h, p in self.endpoints), inter, epoch)
        await asyncio.to_thread(self.zk.elect_controller)
        self.zk.watch_children(CONFIG_CHANGES, self._on_config_changes)
        if cfg.metrics_port >= 0:
            self.metrics_server = MetricsServer(self, listener.host, cfg.metrics_port)
            await self.metrics_server.start()
        self._start_periodic()
        if cfg.get("kbroker.zookeeper.session.fencing.enable"):
            self._tasks.append(self.loop.create_task(self._session_fence()))
        self.group_coordinator.start()   # loads the __consumer_offsets partitions we lead, runs offset expiry
        self.txn_coordinator.start()     # loads the __transaction_state partitions we lead, finishes Prepare*

    def _listener(self, e) -> Listener:
        """A listener with its TLS context (SSL, SASL_SSL) from its own ssl.* values."""
        ctx = mapper = None
        if e.security_protocol in ("SSL", "SASL_SSL"):
            ctx = tls.server_context(self.dynamic_tls.getter(e.listener_name))
            mapper = tls.PrincipalMapper(self.config.listener_get(e.listener_name, "ssl.principal.mapping.rules"))
        sasl = None
        if e.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            sasl = self._sasl_listener(e.listener_name)
        return Listener(e.listener_name, e.security_protocol, e.host, e.port, ctx, mapper, sasl)

    def _sasl_listener(self, name: str) -> SaslListener:
        cfg = self.config
        mechanisms = [m.strip().upper() for m in cfg.listener_get(name, "sasl.enabled.mechanisms") or [] if m.strip()]
        bad = [m for m in mechanisms if m not in SASL_SUPPORTED]
        if bad or not mechanisms:
            raise ConfigError(f"Invalid value {','.join(mechanisms)} for configuration sasl.enabled.mechanisms "
                              f"(listener {name}): kbroker serves {', '.join(SASL_SUPPORTED)}",
                              "sasl.enabled.mechanisms")
        users = {k[5:]: v for k, v in jaas_options(cfg.listener_get(name, "plain.sasl.jaas.config")).items()
                 if k.startswith("user_")}
        if "PLAIN" in mechanisms and not users:
            key = f"listener.name.{name.lower()}.plain.sasl.jaas.config"
            raise ConfigError(f"{key} must name the PLAIN users (user_<name>=\"<password>\")", key)
        return SaslListener(mechanisms, users, self._scram_credential,
                            cfg.get("connection.failed.authentication.delay.ms"),
                            cfg.listener_get(name, "connections.max.reauth.ms") or 0)

    async def _scram_credential(self, mechanism: str, user: str):
        """The user's stored SCRAM credential for ``mechanism`` (ZooKeeper /config/users/<user>), or None."""
        try:
            config = await asyncio.to_thread(get_user_config, self.zk.kazoo, user)
        except ValueError:          # not a user name ZooKeeper can hold
            return None
        text = config.get(mechanism)
        if text is None:
            return None
        try:
            return ScramCredential.decode(text)
        except (ValueError, KeyError):
            log.warning("/config/users/%s holds a malformed %s credential", user, mechanism)
            return None

    def _pool_bytes(self) -> int:
        # Kafka's default -1 means unbounded; we always bound it (four maximum-size requests).
        q = self.config.get("queued.max.request.bytes")
        max_req = self.config.get("socket.request.max.bytes")
        return q if q and q > 0 else max(4 * max_req, 256 << 20)

    def _start_periodic(self) -> None:
        cfg = self.config
        self._every(cfg.get("log.retention.check.interval.ms"), self.logs.cleanup_expired, "retention")
        self._every(cfg.log_flush_interval_ms if cfg.log_flush_interval_ms and cfg.log_flush_interval_ms < 2**62
                    else cfg.get("log.flush.scheduler.interval.ms"), self.logs.flush_dirty, "flush")
        self._every(min(cfg.get("log.flush.offset.checkpoint.interval.ms"), 5000), self._checkpoint, "checkpoint")
        # file.delete.delay.ms / log.segment.delete.delay.ms have their own timer: freed space comes back
        # when the delay ends, not at the next retention pass.
        self._every(200, self.logs.remove_due_files, "file-delete")

    def _every(self, interval_ms, fn, name) -> None:
        if not interval_ms or interval_ms <= 0 or interval_ms >= 2**62:
            return

        async def loop():
            while True:
                await asyncio.sleep(interval_ms / 1000)
                try:
                    r = fn()
                    if inspect.isawaitable(r):
                        await r
                except Exception:
                    log.exception("periodic %s failed", name)

        self._tasks.append(self.loop.create_task(loop()))

    def _log_dir_failed(self, d: str, tps) -> None:
        """LogManager.on_dir_failure (on the loop): the dir's partitions stop being served here and the
        controller is told (/log_dir_event_notification; it moves their leadership to other replicas).
        With every dir offline the broker stops, exit code 1, as Kafka does."""
        self.replica_manager.log_dir_failed(tps)
        if len(self.logs.offline_dirs) == len(self.logs.log_dirs):
            self.fatal = f"every log dir failed (the last: {d})"
            log.error("broker %d: %s; shutting down", self.broker_id, self.fatal)
            if self.request_stop is not None:
                self.request_stop()
            return
        task = self.loop.create_task(asyncio.to_thread(self.zk.notify_log_dir_failure, self.broker_id))
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or log.error(
            "cannot tell the controller that log dir %s failed: %r", d, t.exception()))

    def _checkpoint(self):
        """The logs' offsets are read here on the loop; the files are written on the checkpoint thread."""
        snapshot = self.logs.checkpoint_snapshot()
        return self.loop.run_in_executor(self._checkpoint_thread, self.logs.write_checkpoints, snapshot)

    async def stop(self) -> None:
        if self.server is not None and self.zk is not None and self.zk.broker_epoch is not None:
            await self._controlled_shutdown()
        if self.controller is not None:
            self.controller.stop()
        for t in self._tasks:
            t.cancel()
        self.group_coordinator.stop()    # waiting JoinGroup/SyncGroup requests get NOT_COORDINATOR
        self.txn_coordinator.stop()      # marker sending stops; the next coordinator finishes Prepare*
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self.server is not None:
            await self.server.stop()
        if self.fetch_sessions is not None:
            self.fetch_sessions.close()     # after the listener: no fetch makes a session any more
        if self.authorizer is not None:
            self.authorizer.stop()
        if self.zk is not None:
            await asyncio.to_thread(self.zk.close)
        if self.logs is not None:
            if self.replica_manager is not None:
                await self.replica_manager.stop()
            # a periodic write still running finishes before the final one (no older snapshot after it)
            self._checkpoint_thread.shutdown(wait=True)
            self.logs.shutdown()
        self._stopped.set()

    async def _controlled_shutdown(self) -> None:
        """Ask the controller to move our leaderships away before the listener closes
        (``controlled.shutdown.*``); on failure after the retries, stop anyway (Kafka does too)."""
        from .apis.controlled_shutdown import request_controlled_shutdown
        await request_controlled_shutdown(self)

    async def _session_fence(self) -> None:
        """Stop leading once ZooKeeper may have expired our session (``zk.lease``, zk/lease.py): the
        controller may already have elected other leaders, and clients that still reach us must hear
        NOT_LEADER_OR_FOLLOWER and look for them elsewhere. Checked on every tick while the lease is out,
        so a LeaderAndIsr applied meanwhile cannot make us lead on it. When the lease is renewed in the
        same session, ZooKeeper never expired us and the controller saw nothing (it sends nothing):
        partitions whose state znode is unchanged are led again (ReplicaManager.resume_fenced). In a new
        session BrokerZk re-registers and the controller's LeaderAndIsr decides, as after any expiry."""
        zk, rm = self.zk, self.replica_manager
        lease = zk.lease
        out_in = None                   # the session whose lease ran out
        me = None                       # our own entry, left out of our Metadata answers meanwhile
        while True:
            await asyncio.sleep(min(0.1, lease.heartbeat_s))
            try:
                if lease.expired():
                    out_in = lease.session_id if out_in is None else out_in
                    rm.fence_leaders()
                    # Nor do we count as a live broker in our Metadata answers (ZooKeeper may not list us
                    # any more): clients drop this connection and ask the others, who know the new leaders.
                    # Unless we are the only one listed: an answer naming no broker leaves a client with
                    # nowhere to ask (librdkafka then stops refreshing metadata for good).
                    brokers = self.metadata.brokers
                    if len(brokers) > 1 or self.broker_id not in brokers:
                        me = brokers.pop(self.broker_id, None) or me
                    self.self_fenced = True         # DescribeCluster v2 lists us as fenced
                elif out_in is not None:
                    same, out_in = lease.session_id == out_in, None
                    self.self_fenced = False
                    if me is not None:
                        self.metadata.brokers.setdefault(self.broker_id, me)
                        me = None
                    if same:
                        await rm.resume_fenced()
            except Exception:
                log.exception("session fencing check failed")

    def _acls_changed(self) -> None:
        """Every connection drops the decisions it keeps (the next request asks again)."""
        if self.server is not None:
            authz_api.forget_all(self.server.connections)

    # ---- controller and metadata ------------------------------------------------------------------
    def _on_controller_change(self, controller_id, is_controller, epoch) -> None:
        """/controller changed (loop thread): run the controller while this broker holds it."""
        log.info("controller is now %s (epoch %d)", controller_id, epoch)
        if self.controller is None:
            self.controller = Controller(self.zk, self.broker_id, self.config.get, self.metrics,
                                         inter_broker_listener=self.config.inter_broker_listener.listener_name,
                                         security=self.inter_broker_security)
        if is_controller:
            self.controller.start(epoch)
        else:
            self.controller.stop()

    async def apply_update_metadata(self, body) -> None:
        """The controller's UpdateMetadata: read the configs of topics new to this broker (worker
        thread), swap the cache on the loop, then open the logs of the changed topics."""
        async with self._metadata_lock:
            md = self.metadata
            new = sorted({ts["topic_name"] for ts in body["topic_states"]
                          if ts["topic_name"] not in md.topics
                          and any(ps["leader"] != -2 for ps in ts["partition_states"])})
            configs = await asyncio.to_thread(self._read_topic_configs, new) if new else {}
            changed, removed = md.apply_update_metadata(body, configs)
            for name in removed:
                if name not in changed:         # gone, not deleted and created again in one update
                    self.logs.forget_topic(name)
            for name, info in changed.items():
                self.open_logs(info, config_changed=name in configs)

    def _on_config_changes(self, children) -> None:
        """/config/changes children (loop thread): re-read the configs of topics named by
        notifications newer than the last one seen (the first call only records where we are)."""
        seqs = {c: int(c.rsplit("_", 1)[1]) for c in children if c.rsplit("_", 1)[-1].isdigit()}
        last = self._config_change_seq
        self._config_change_seq = max(seqs.values(), default=last if last is not None else -1)
        if last is None:
            # client quotas changed between their load and this watch are read again
            self.loop.create_task(self.quotas.reload_all())
            return
        fresh = sorted((c for c, n in seqs.items() if n > last), key=seqs.get)
        if fresh:
            self.loop.create_task(self._apply_config_changes(fresh))

    async def _apply_config_changes(self, children) -> None:
        changes = await asyncio.to_thread(self.zk.read_config_changes, children)
        names = sorted({name for kind, name in changes if kind == "topics"})
        if names:
            await self.refresh_metadata(names)
        await self.quotas.reload([f"{kind}/{name}" for kind, name in changes if kind in ("users", "clients", "ips")])

    async def refresh_metadata(self, names=None) -> None:
        """Re-read the config overrides of ``names`` (all cached topics if None) from ZooKeeper and
        apply them to the open logs (after a config change)."""
        async with self._metadata_lock:
            md = self.metadata
            wanted = sorted(md.topics) if names is None else [n for n in names if n in md.topics]
            configs = await asyncio.to_thread(self._read_topic_configs, wanted)
            for name, config in configs.items():
                info = md.topics.get(name)
                if info is not None and info.config != config:
                    info.config = config
                    self.open_logs(info, config_changed=True)

    def _read_topic_configs(self, names):
        """{topic: overrides} from ZooKeeper (worker thread); ``None`` = every topic."""
        zk = self.zk
        return {name: zk.get_topic_config(name) for name in (zk.get_topics() if names is None else names)}

    @staticmethod
    def _typed(config: dict) -> dict:
        return {k: parse_topic_config(k, v) for k, v in config.items()}

    def topic_overrides(self, topic: TopicInfo) -> dict:
        """The topic's config overrides (from ZooKeeper), typed."""
        return {k: parse_topic_config(k, v) for k, v in topic.config.items()}

    def topic_config(self, topic: TopicInfo) -> dict:
        """Effective config: the broker's topic defaults overlaid with the topic's overrides."""
        eff = self.config.topic_defaults()
        eff.update(self.topic_overrides(topic))
        return eff

    def open_logs(self, topic: TopicInfo, config_changed: bool = True) -> None:
        """Re-apply the topic's config to its open logs when the overrides changed. Logs open and
        leadership changes only through LeaderAndIsr (ReplicaManager), as in Kafka's ZooKeeper mode."""
        if config_changed:
            self.logs.set_topic_config(topic.name, self.topic_overrides(topic))

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class _AcceptErrorFilter:
    """asyncio's accept loop survives EMFILE (it pauses accepting for a second), but reports it once
    per backlog slot on every retry: thousands of tracebacks a second while descriptors are
    exhausted. Log it at most every 10 s with a count; everything else goes to the default handler."""

    INTERVAL_S = 10.0

    def __init__(self):
        self.suppressed = 0
        self.last = -1e9

    def __call__(self, loop, context):
        if context.get("message") != "socket.accept() out of system resource":
            loop.default_exception_handler(context)
            return
        now = loop.time()
        if now - self.last < self.INTERVAL_S:
            self.suppressed += 1
            return
        log.warning("cannot accept connections: %s (%d similar reports suppressed); retrying",
                    context.get("exception"), self.suppressed)
        self.last, self.suppressed = now, 0


async def _main(config: BrokerConfig) -> int:
    broker = Broker(config)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_AcceptErrorFilter())
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    broker.request_stop = stop.set
    try:
        await broker.start()
    except Exception:
        log.exception("broker %d failed to start", config.broker_id)
        await broker.stop()
        return 1
    log.info("[KafkaServer id=%d] started", config.broker_id)
    await stop.wait()
    log.info("[KafkaServer id=%d] shutting down", config.broker_id)
    await broker.stop()
    log.info("[KafkaServer id=%d] shut down completed", config.broker_id)
    return 1 if broker.fatal else 0


def run(config: BrokerConfig) -> int:
    """Run one broker in the foreground until SIGTERM/SIGINT; returns the process exit code."""
    return asyncio.run(_main(config))
