"""The broker's ZooKeeper client: registration, controller election (/controller, fenced by the
controller epoch), topic, partition-state and config znodes, and watches.

Threads (see python-zk/kazoo#355/#405/#491 for why it is shaped this way):

* kazoo's connection thread runs our state listener. The listener only records
  the state and queues work: calling ZooKeeper from it deadlocks.
* kazoo's callback thread runs watch callbacks (``/controller``, topic
  children). They also only record and queue.
* our worker thread (``kbroker-zk``) runs everything events trigger: after a
  session expiry it re-creates the broker registration (kazoo never re-creates
  ephemerals) and re-runs the controller election, retrying until it succeeds.
* callbacks to the broker go through ``loop.call_soon_threadsafe`` when a loop
  was given, so broker code runs on its own event loop.

The public methods block on ZooKeeper round trips (about 1 ms locally). The
broker calls them at start-up, from admin request handlers via an executor,
or from its controller logic - never on the produce/fetch path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError, RolledBackError
from kazoo.retry import KazooRetry

from . import acls as zk_acls
from . import layout as L
from .lease import NegotiatedTimeoutLogger, SessionLease

log = logging.getLogger("kbroker.zk")


class ZkClientError(Exception):
    """Base class of the errors below."""


class BrokerRegistrationError(ZkClientError):
    pass


class TopicExistsError(ZkClientError):
    pass


class TopicNotFoundError(ZkClientError):
    pass


class PartitionNotFoundError(ZkClientError):
    pass


class StaleVersionError(ZkClientError):
    """A compare-and-set found a different znode version (someone wrote in between)."""


class NotControllerError(ZkClientError):
    """A controller-only write was attempted by a broker that is not (or no longer) the controller."""


_RECOVER = "recover"
_ELECT = "elect"
_STOP = "stop"


NETTY_SOCKET = "org.apache.zookeeper.ClientCnxnSocketNetty"


# Kafka's ZooKeeper client TLS keys a tool's --zk-tls-config-file is read for (others ignored; a PEM
# truststore has no password)
ZK_TLS_KEYS = ("zookeeper.ssl.client.enable", "zookeeper.clientCnxnSocket", "zookeeper.ssl.keystore.location",
               "zookeeper.ssl.keystore.password", "zookeeper.ssl.keystore.type", "zookeeper.ssl.truststore.location",
               "zookeeper.ssl.truststore.type", "zookeeper.ssl.endpoint.identification.algorithm")


def kazoo_tls_from_properties(props: dict[str, str]) -> dict | None:
    """kazoo_tls of Kafka properties as text (a tool's --zk-tls-config-file, a local cluster's settings);
    keys other than ZK_TLS_KEYS are ignored, as Kafka's tools ignore them."""
    def get(key):
        value = props.get(key) if key in ZK_TLS_KEYS else None
        if key == "zookeeper.ssl.client.enable":
            return value is not None and str(value).strip().lower() == "true"
        return value
    return kazoo_tls(get)


def tls_verification_failures(hosts: str, tls: dict, timeout_s: float = 5.0) -> list[str]:
    """One TLS handshake with each ``host:port`` of a connect string (no chroot), as kazoo makes it with
    ``tls`` (kazoo_tls): why each server whose certificate fails verification was refused. kazoo only
    says "connection dropped" and retries, so this names the cause (a server that cannot be reached
    is not listed: kazoo retries those)."""
    import socket
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = bool(tls.get("check_hostname"))
    if tls.get("ca"):
        ctx.load_verify_locations(tls["ca"])
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if tls.get("certfile"):
        ctx.load_cert_chain(tls["certfile"], tls.get("keyfile"), tls.get("keyfile_password"))
    out = []
    for hp in hosts.split(","):
        host, _, port = hp.strip().rpartition(":")
        host = host.strip("[]")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s) as raw, \
                    ctx.wrap_socket(raw, server_hostname=host):
                pass
        except ssl.SSLCertVerificationError as e:
            why = e.verify_message or str(e)
            # 62, 64: OpenSSL's host name and IP address mismatch
            hint = (" (zookeeper.ssl.endpoint.identification.algorithm=HTTPS: the certificate must name the host "
                    "as written in zookeeper.connect)" if ctx.check_hostname and e.verify_code in (62, 64) else "")
            out.append(f"ZooKeeper at {host}:{port} presented a TLS certificate that failed verification: {why}{hint}")
        except (OSError, ValueError):
            continue
    return out


def kazoo_tls(get) -> dict | None:
    """kazoo's TLS arguments from Kafka's zookeeper.ssl.* keys (``get(key)`` reads a broker config), or
    None when zookeeper.ssl.client.enable is false. kazoo reads PEM files only: a keystore or truststore
    of another type (given, or as ZooKeeper guesses it from the file name) is refused, naming the key.
    ZooKeeper's server asks for a client certificate unless told otherwise, so the keystore is passed
    whenever it is set. ``zookeeper.ssl.endpoint.identification.algorithm`` HTTPS (the default) checks
    the server's certificate against the host name or address of the connect string, as ZooKeeper's
    hostnameVerification. Raises ValueError with the key in its message."""
    if not get("zookeeper.ssl.client.enable"):
        return None
    socket_class = get("zookeeper.clientCnxnSocket")
    if socket_class and socket_class != NETTY_SOCKET:
        raise ValueError(f"zookeeper.clientCnxnSocket must be {NETTY_SOCKET} with zookeeper.ssl.client.enable=true "
                         f"(kazoo speaks TLS itself), not {socket_class}")
    algorithm = get("zookeeper.ssl.endpoint.identification.algorithm")
    algorithm = "HTTPS" if algorithm is None else algorithm.strip()     # unset: Kafka's default
    if algorithm.upper() not in ("HTTPS", ""):
        raise ValueError(f"zookeeper.ssl.endpoint.identification.algorithm: HTTPS (check that ZooKeeper's "
                         f"certificate names the host connected to) or empty (do not), not {algorithm}")
    out = {"use_ssl": True, "verify_certs": True, "check_hostname": bool(algorithm)}
    for location_key, type_key, arg in (
            ("zookeeper.ssl.keystore.location", "zookeeper.ssl.keystore.type", "certfile"),
            ("zookeeper.ssl.truststore.location", "zookeeper.ssl.truststore.type", "ca")):
        location = get(location_key)
        if not location:
            continue
        kind = (get(type_key) or ("PEM" if location.lower().endswith(".pem") else
                                  location.rsplit(".", 1)[-1])).upper()
        if kind != "PEM":
            raise ValueError(f"{type_key}: kbroker's ZooKeeper client (kazoo) reads PEM files only, "
                             f"not {kind} ({location})")
        if not os.path.isfile(location):
            raise ValueError(f"{location_key}: no such file {location}")
        out[arg] = location
    if "certfile" in out:
        out["keyfile"] = out["certfile"]      # one PEM file holds the key and its chain, as Kafka's PEM keystore
        if get("zookeeper.ssl.keystore.password"):
            out["keyfile_password"] = get("zookeeper.ssl.keystore.password")
    return out


class BrokerZk:
    """ZooKeeper state of one broker (``broker_id``) in Kafka's classic layout.

    ``connect_string`` may carry a chroot (``host:port/kafka``), created if absent.

    Callbacks (attributes, may be set before ``start()``), run on ``loop`` when given,
    else on the worker/kazoo thread:

    * ``on_session_lost()``: the ZooKeeper session expired; the registration and any
      controllership are gone until ``on_reregistered`` follows.
    * ``on_reregistered(broker_epoch)``: after an expiry, registration (and election,
      if this broker takes part) succeeded again under a new session.
    * ``on_controller_change(controller_id_or_None, is_controller, controller_epoch)``.

    ``lease`` (zk/lease.py) says when the session may have expired at the server while this broker
    cannot reach it; a heartbeat read every tenth of the session timeout keeps it current.

    Without a loop the callbacks run on the worker thread (never on kazoo's
    threads), one at a time; they should return quickly.
    """

    def __init__(self, connect_string: str, broker_id: int, session_timeout_ms: int = 18000,
                 loop: asyncio.AbstractEventLoop | None = None, *, connect_timeout_s: float = 15.0,
                 digest: str | None = None, tls: dict | None = None, secure_acls: bool | None = None):
        self.connect_string = connect_string
        # ZooKeeper client TLS: kazoo's keyword arguments (kazoo_tls), or None for plaintext
        self._tls = dict(tls or {})
        # zookeeper.set.acl: every znode this client creates may be changed only by its identity
        # (zk/acls.py secure_acls): "user:password" of ZooKeeper's digest scheme, or the TLS client
        # certificate, which ZooKeeper's x509 scheme authenticates on connect. Default: on with a digest.
        self._auth = zk_acls.digest_auth(digest) if digest else None
        self._secure = bool(digest) if secure_acls is None else secure_acls
        self.broker_id = int(broker_id)
        self.session_timeout_ms = int(session_timeout_ms)
        self.loop = loop
        self.connect_timeout_s = connect_timeout_s
        self.cluster_id: str | None = None
        self.broker_epoch: int | None = None
        self.on_session_lost: Callable[[], None] | None = None
        self.on_reregistered: Callable[[int], None] | None = None
        self.on_controller_change: Callable[[int | None, bool, int], None] | None = None

        self._zk: KazooClient | None = None
        self._tasks: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._closing = threading.Event()
        self._lock = threading.RLock()        # guards the controller fields and registration
        self._elect_lock = threading.Lock()   # one election at a time (caller and worker)
        self._session_lost = False
        self._registration: tuple | None = None     # (host, port, rack, endpoints, protocol map)
        self._wants_controller = False
        self._controller_watch_started = False
        self._is_controller = False
        self._controller_id: int | None = None
        self._controller_epoch = 0
        self._controller_epoch_zk_version = -1
        self._topic_watchers: list[Callable[[list[str]], None]] = []
        self.lease = SessionLease(self.session_timeout_ms)
        self._heartbeat: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        hosts, _, chroot = self.connect_string.partition("/")
        if self._tls:
            refused = tls_verification_failures(hosts, self._tls, timeout_s=min(5.0, self.connect_timeout_s))
            for why in refused:
                log.error("%s", why)
            if refused and len(refused) == len(hosts.split(",")):
                raise ZkClientError(f"cannot connect to ZooKeeper at {self.connect_string}: {refused[0]}")
        if chroot:
            self._ensure_chroot(hosts, "/" + chroot)
        # Retry connecting forever: a broker waits out a ZooKeeper restart.
        self.lease = SessionLease(self.session_timeout_ms)
        self._zk = KazooClient(hosts=self.connect_string, timeout=self.session_timeout_ms / 1000.0,
                               auth_data=self._auth, **self._tls, default_acl=zk_acls.secure_acls() if self._secure else None,
                               connection_retry=KazooRetry(max_tries=-1, max_delay=2.0),
                               command_retry=KazooRetry(max_tries=5, max_delay=2.0),
                               logger=NegotiatedTimeoutLogger(logging.getLogger("kazoo.client"), self.lease))
        self._zk.add_listener(self._on_state)
        try:
            self._zk.start(timeout=self.connect_timeout_s)
        except Exception as exc:
            self._zk.stop()
            self._zk.close()
            raise ZkClientError(f"cannot connect to ZooKeeper at {self.connect_string} "
                                f"within {self.connect_timeout_s}s: {exc!r}") from exc
        for path in L.PERSISTENT_PATHS:
            self._zk.retry(self._zk.ensure_path, path)
        if self._secure:
            if not chroot:
                log.warning("zookeeper.set.acl without a chroot in zookeeper.connect: ZooKeeper's own / stays "
                            "open, so anyone may delete /controller (an ephemeral; a new election follows)")
            for path in zk_acls.SENSITIVE_PATHS:
                self._zk.retry(self._zk.ensure_path, path)
                self._zk.retry(self._zk.set_acls, path, zk_acls.secure_acls(sensitive=True))
        self.cluster_id = self.get_or_create_cluster_id()
        self._worker = threading.Thread(target=self._work, name=f"kbroker-zk-{self.broker_id}", daemon=True)
        self._worker.start()
        self._heartbeat = threading.Thread(target=self._beat, name=f"kbroker-zk-lease-{self.broker_id}",
                                           daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        """Renew ``lease`` with a read every heartbeat period while connected (kazoo's own pings are
        not observable). Each read's send time becomes the anchor once ZooKeeper answers it."""
        zk = self._zk
        while not self._closing.wait(self.lease.heartbeat_s):
            client_id = zk.client_id
            if zk.state != KazooState.CONNECTED or not client_id:
                continue
            sent = time.monotonic()
            try:
                zk.exists_async("/").get(timeout=self.lease.timeout_ms / 1000)
            except Exception:
                continue          # lost, suspended or slow: the anchor stays where it was
            if zk.client_id == client_id:
                self.lease.heard(sent, client_id[0])

    def close(self) -> None:
        """Stop the worker and close the session: our ephemerals vanish at once."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._tasks.put(_STOP)
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=10)
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(timeout=10)
        if self._zk is not None:
            try:
                self._zk.stop()
            finally:
                self._zk.close()
        self._is_controller = False

    def __enter__(self) -> "BrokerZk":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def kazoo(self) -> KazooClient:
        """The underlying client (tests and tools)."""
        assert self._zk is not None, "start() first"
        return self._zk

    @property
    def session_id(self) -> int | None:
        """The current session id (None while no session is established)."""
        client_id = self.kazoo.client_id
        return client_id[0] if client_id else None

    @property
    def connected(self) -> bool:
        return self._zk is not None and self._zk.state == KazooState.CONNECTED

    def _ensure_chroot(self, hosts: str, chroot: str) -> None:
        zk = KazooClient(hosts=hosts, timeout=self.session_timeout_ms / 1000.0, auth_data=self._auth, **self._tls,
                         default_acl=zk_acls.secure_acls() if self._secure else None)
        try:
            zk.start(timeout=self.connect_timeout_s)
            zk.ensure_path(chroot)
        except Exception as exc:
            raise ZkClientError(f"cannot create chroot {chroot} on {hosts}: {exc!r}") from exc
        finally:
            zk.stop()
            zk.close()

    # --- cluster id --------------------------------------------------------

    def get_or_create_cluster_id(self) -> str:
        zk = self.kazoo
        try:
            data, _ = zk.retry(zk.get, L.CLUSTER_ID)
            return L.decode_cluster_id(data)
        except NoNodeError:
            pass
        try:
            zk.create(L.CLUSTER_ID, L.encode_cluster_id(L.new_uuid_base64()), makepath=True)
        except NodeExistsError:
            pass  # another broker won the race; its id is the cluster's
        data, _ = zk.retry(zk.get, L.CLUSTER_ID)
        return L.decode_cluster_id(data)

    # --- broker registration -----------------------------------------------

    def register_broker(self, host: str, port: int, rack: str | None = None,
                        wait_timeout_s: float | None = None, *,
                        endpoints: list[tuple[str, str, int]] | None = None,
                        security_protocol_map: dict[str, str] | None = None) -> int:
        """Create the ephemeral ``/brokers/ids/<id>``; return the broker epoch (its czxid).

        A node left by an older session of this broker id (a restart within the
        old session's timeout) is waited for until ZooKeeper expires it - never
        deleted, as it may belong to a live broker configured with the same id.
        Gives up after ``wait_timeout_s`` (default 2 x session timeout).
        """
        with self._lock:
            self._registration = (host, int(port), rack, endpoints, security_protocol_map)
        epoch = self._register(wait_timeout_s)
        self.broker_epoch = epoch
        return epoch

    def _register(self, wait_timeout_s: float | None = None) -> int:
        zk = self.kazoo
        host, port, rack, endpoints, protocols = self._registration
        path = L.broker_path(self.broker_id)
        data = L.encode_broker(host, port, rack, endpoints=endpoints, security_protocol_map=protocols)
        if wait_timeout_s is None:
            wait_timeout_s = 2 * self.session_timeout_ms / 1000.0
        deadline = time.monotonic() + wait_timeout_s
        while True:
            client_id, sent = zk.client_id, time.monotonic()
            try:
                # retry: a create whose reply was lost comes back as NodeExists, owned by us (below)
                _, stat = zk.retry(zk.create, path, data, ephemeral=True, makepath=True, include_data=True)
                # Recorded at once: the controller may address us with this epoch any moment now.
                self.broker_epoch = stat.czxid
                self._renew_lease(client_id, sent)
                log.info("registered broker %d at %s:%d (epoch %d)", self.broker_id, host, port, stat.czxid)
                return stat.czxid
            except NodeExistsError:
                pass
            gone = threading.Event()
            client_id, sent = zk.client_id, time.monotonic()
            stat = zk.retry(zk.exists, path, watch=lambda event: gone.set())
            if stat is None:
                continue  # it vanished between create and exists
            if stat.ephemeralOwner == self.session_id:
                # Ours: a retried create whose first attempt succeeded, or a repeated call.
                self.broker_epoch = stat.czxid
                self._renew_lease(client_id, sent)
                return stat.czxid
            if stat.ephemeralOwner == 0:
                raise BrokerRegistrationError(f"{path} is a persistent znode; remove it by hand")
            log.warning("%s is held by session 0x%x; waiting for it to expire", path, stat.ephemeralOwner)
            while not gone.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BrokerRegistrationError(
                        f"{path} is still held by another session (0x{stat.ephemeralOwner:x}) after "
                        f"{wait_timeout_s:.1f}s: is another broker running with broker.id={self.broker_id}?")
                if self._closing.is_set():
                    raise BrokerRegistrationError("closed while waiting for the old registration to expire")
                gone.wait(min(remaining, 0.5))

    def _renew_lease(self, client_id, sent: float) -> None:
        # A registration answered in session ``client_id`` renews the lease there before the controller
        # can see us: a LeaderAndIsr that follows must not meet the lease of a session that expired.
        if client_id and self.kazoo.client_id == client_id:
            self.lease.heard(sent, client_id[0])

    def get_broker(self, broker_id: int) -> L.BrokerRegistration | None:
        try:
            data, _ = self.kazoo.retry(self.kazoo.get, L.broker_path(broker_id))
        except NoNodeError:
            return None
        return L.decode_broker(broker_id, data)

    def get_broker_ids(self) -> list[int]:
        return sorted(int(c) for c in self.kazoo.retry(self.kazoo.get_children, L.BROKER_IDS))

    # --- controller --------------------------------------------------------

    @property
    def is_controller(self) -> bool:
        return self._is_controller

    @property
    def controller_epoch(self) -> int:
        """The epoch this broker won (if controller), else the last one seen."""
        return self._controller_epoch

    def controller_id(self) -> int | None:
        """Read ``/controller``; None if no broker holds it."""
        try:
            data, _ = self.kazoo.retry(self.kazoo.get, L.CONTROLLER)
        except NoNodeError:
            return None
        return L.decode_controller(data).broker_id

    def current_controller(self) -> tuple[int | None, int]:
        """(broker id holding ``/controller`` or None, ``/controller_epoch``), read after a sync so a
        lagging ensemble member cannot answer with an older controller than one that already spoke."""
        zk = self.kazoo
        zk.retry(zk.sync, L.CONTROLLER_EPOCH)
        try:
            data, _ = zk.retry(zk.get, L.CONTROLLER_EPOCH)
            epoch = L.decode_controller_epoch(data)
        except NoNodeError:
            epoch = 0
        return self.controller_id(), epoch

    def elect_controller(self) -> bool:
        """Try to become controller; True if this broker is (now) the controller.

        One multi-op creates the ephemeral ``/controller`` and bumps
        ``/controller_epoch`` at the version we read, so two brokers can never both
        win the same epoch. Afterwards ``/controller`` is watched and the
        election re-run when it disappears.
        """
        with self._elect_lock:
            return self._elect()

    def _elect(self) -> bool:
        zk = self.kazoo
        self._wants_controller = True
        if not self._controller_watch_started:
            self._controller_watch_started = True
            zk.DataWatch(L.CONTROLLER, self._on_controller_data)
        for _ in range(10):
            try:
                data, stat = zk.retry(zk.get, L.CONTROLLER)
                info = L.decode_controller(data)
                with self._lock:
                    self._controller_id = info.broker_id
                    mine = stat.ephemeralOwner == self.session_id
                    if mine and self._is_controller:
                        return True  # already elected in this session
                    if not mine:
                        self._set_not_controller(info.broker_id)
                if mine:
                    # Ours but we were fenced (the epoch moved): resign and run again for a new epoch.
                    try:
                        zk.retry(zk.delete, L.CONTROLLER, version=stat.version)
                    except (NoNodeError, BadVersionError):
                        pass
                    continue
                try:
                    epoch_data, _ = zk.retry(zk.get, L.CONTROLLER_EPOCH)
                    self._controller_epoch = L.decode_controller_epoch(epoch_data)
                except NoNodeError:
                    pass
                return False
            except NoNodeError:
                pass
            try:
                epoch_data, epoch_stat = zk.retry(zk.get, L.CONTROLLER_EPOCH)
                epoch, epoch_version = L.decode_controller_epoch(epoch_data), epoch_stat.version
            except NoNodeError:
                epoch, epoch_version = 0, None
            new_epoch = epoch + 1
            tx = zk.transaction()
            tx.create(L.CONTROLLER, L.encode_controller(self.broker_id), ephemeral=True)
            if epoch_version is None:
                tx.create(L.CONTROLLER_EPOCH, L.encode_controller_epoch(new_epoch))
            else:
                tx.set_data(L.CONTROLLER_EPOCH, L.encode_controller_epoch(new_epoch), version=epoch_version)
            results = tx.commit()
            if not _failed(results):
                with self._lock:
                    self._controller_epoch = new_epoch
                    # create gives version 0; set_data gives the next version
                    self._controller_epoch_zk_version = 0 if epoch_version is None else results[1].version
                    self._controller_id = self.broker_id
                    self._is_controller = True
                log.info("broker %d is controller (epoch %d)", self.broker_id, new_epoch)
                self._deliver(self.on_controller_change, self.broker_id, True, new_epoch)
                return True
            # Lost a race (on /controller or on the epoch): read again and decide.
        raise ZkClientError("controller election did not settle after 10 attempts")

    def _set_not_controller(self, controller_id: int | None) -> None:
        was = self._is_controller
        self._is_controller = False
        self._controller_id = controller_id
        if was:
            log.warning("broker %d is no longer controller", self.broker_id)
            self._deliver(self.on_controller_change, controller_id, False, self._controller_epoch)

    def _on_controller_data(self, data, stat, event=None):
        # kazoo callback thread: record and queue only.
        if self._closing.is_set():
            return False
        if data is None:
            with self._lock:
                self._set_not_controller(None)
            self._tasks.put(_ELECT)
            return None
        try:
            info = L.decode_controller(data)
        except (ValueError, KeyError, TypeError):
            log.error("unreadable /controller: %r", data)
            return None
        with self._lock:
            if self._zk is not None and stat is not None and stat.ephemeralOwner != self.session_id:
                self._set_not_controller(info.broker_id)
            else:
                self._controller_id = info.broker_id
        return None

    def _controller_check(self, tx) -> None:
        """Fence a controller write: the multi fails if /controller_epoch moved on."""
        with self._lock:
            if not self._is_controller:
                raise NotControllerError(f"broker {self.broker_id} is not the controller")
            tx.check(L.CONTROLLER_EPOCH, self._controller_epoch_zk_version)

    def _controller_moved(self) -> NotControllerError:
        with self._lock:
            self._set_not_controller(None)
        self._tasks.put(_ELECT)
        return NotControllerError("controller epoch changed in ZooKeeper: another controller took over")

    # --- session handling --------------------------------------------------

    def _on_state(self, state: str) -> None:
        # kazoo connection thread: never call ZooKeeper here (it deadlocks).
        if self._closing.is_set():
            return
        if state == KazooState.LOST:
            self._session_lost = True
            with self._lock:  # held only around field updates, never around ZooKeeper calls
                self._set_not_controller(None)
            log.warning("ZooKeeper session of broker %d expired", self.broker_id)
            self._deliver(self.on_session_lost)
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            self._tasks.put(_RECOVER)

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task == _STOP or self._closing.is_set():
                return
            if isinstance(task, tuple):
                fn, args = task
                try:
                    fn(*args)
                except Exception:
                    log.exception("callback %r failed", fn)
            elif task == _RECOVER:
                self._retry_until_done(self._recover)
            elif task == _ELECT and self._wants_controller and not self._session_lost:
                self._retry_until_done(self.elect_controller)

    def _retry_until_done(self, fn) -> None:
        delay = 0.1
        while not self._closing.is_set():
            try:
                fn()
                return
            except Exception:
                if self._closing.is_set():
                    return
                log.exception("broker %d: %s failed; retrying in %.1fs", self.broker_id, fn.__name__, delay)
            self._closing.wait(delay)  # back off, but wake at once on close()
            delay = min(delay * 2, 2.0)

    def _recover(self) -> None:
        """Re-create what a new session lacks: the registration and the controller election."""
        epoch = None
        if self._registration is not None:
            epoch = self._register()
            self.broker_epoch = epoch
        if self._wants_controller:
            self.elect_controller()
        log.info("broker %d re-registered after session expiry (epoch %s)", self.broker_id, epoch)
        self._deliver(self.on_reregistered, epoch)

    def _deliver(self, fn, *args) -> None:
        if fn is None:
            return
        if self.loop is None:
            self._tasks.put((fn, args))  # the worker runs it: a callback may call ZooKeeper
            return
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # the loop is closed: the broker is shutting down

    # --- topics ------------------------------------------------------------

    def create_topic(self, name: str, assignment: dict[int, list[int]], configs: dict[str, str] | None = None,
                     topic_id: str | None = None) -> str:
        """Write a new topic's assignment and config (admin write, any broker); return its topic id.

        One multi-op: the assignment znode, the config znode and a config change
        notification. The controller sees the new child of /brokers/topics and
        creates the partition state znodes (leadership is its business).
        """
        L.validate_topic_name(name)
        _check_assignment(assignment, start=0)
        configs = dict(configs or {})
        topic_id = topic_id or L.new_uuid_base64()
        zk = self.kazoo
        # A config znode can outlive a topic (Kafka writes it before the topic): overwrite it.
        config_stat = zk.retry(zk.exists, L.topic_config_path(name))
        tx = zk.transaction()
        tx.create(L.topic_path(name), L.encode_topic(assignment, topic_id))
        if config_stat is None:
            tx.create(L.topic_config_path(name), L.encode_config(configs))
        else:
            tx.set_data(L.topic_config_path(name), L.encode_config(configs), version=config_stat.version)
        tx.create(L.CONFIG_CHANGE_PREFIX, L.encode_config_change("topics", name), sequence=True)
        results = tx.commit()
        failure = _failed(results)
        if failure is not None:
            index, exc = failure
            if index == 0 and isinstance(exc, NodeExistsError):
                raise TopicExistsError(f"topic {name!r} already exists")
            if index == 1 and isinstance(exc, (BadVersionError, NoNodeError, NodeExistsError)):
                raise StaleVersionError(f"config of {name!r} changed concurrently")
            raise ZkClientError(f"creating topic {name!r} failed at operation {index}: {exc!r}")
        return topic_id

    # --- controller writes (fenced by /controller_epoch) ---------------------

    def create_partition_states(self, topic: str, states: dict[int, L.PartitionState]) -> dict[int, int]:
        """Create the state znodes of new partitions (controller only); return {partition: zk version}.

        Creates /brokers/topics/<t>/partitions and /partitions/<p> when missing. Raises
        NotControllerError when fenced, StaleVersionError when a state znode already exists.
        """
        zk = self.kazoo
        have_parent = zk.retry(zk.exists, L.topic_partitions_path(topic)) is not None
        existing = set()
        if have_parent:
            existing = {int(p) for p in zk.retry(zk.get_children, L.topic_partitions_path(topic))}
        tx = zk.transaction()
        self._controller_check(tx)
        if not have_parent:
            tx.create(L.topic_partitions_path(topic))
        for p in sorted(states):
            if p not in existing:
                tx.create(L.partition_path(topic, p))
            tx.create(L.partition_state_path(topic, p), L.encode_partition_state(states[p]))
        self._commit_fenced(tx, f"creating partition states of {topic!r}")
        return {p: 0 for p in states}

    def update_partition_states(self, updates: dict[tuple[str, int], tuple[L.PartitionState, int]]
                                ) -> dict[tuple[str, int], int]:
        """Controller CAS of several state znodes in one fenced multi-op.

        ``updates``: {(topic, partition): (new state, expected zk version)}; returns the new
        versions. Raises NotControllerError when fenced and StaleVersionError (naming the
        partition) when a state moved since it was read; nothing is written then.
        """
        if not updates:
            return {}
        keys = sorted(updates)
        tx = self.kazoo.transaction()
        self._controller_check(tx)
        for t, p in keys:
            state, version = updates[(t, p)]
            tx.set_data(L.partition_state_path(t, p), L.encode_partition_state(state), version=version)
        results = self._commit_fenced(tx, "updating partition states", keys=keys)
        return {k: results[i + 1].version for i, k in enumerate(keys)}

    def controller_delete(self, paths: list[str]) -> None:
        """Delete znodes (children before parents, as given) in one fenced multi-op."""
        tx = self.kazoo.transaction()
        self._controller_check(tx)
        for path in paths:
            tx.delete(path)
        self._commit_fenced(tx, f"deleting {len(paths)} znodes")

    def _commit_fenced(self, tx, what: str, keys=None) -> list:
        results = tx.commit()
        failure = _failed(results)
        if failure is None:
            return results
        index, exc = failure
        if index == 0 and isinstance(exc, BadVersionError):
            raise self._controller_moved()
        if isinstance(exc, (BadVersionError, NodeExistsError, NoNodeError)):
            where = keys[index - 1] if keys and 0 < index <= len(keys) else index
            raise StaleVersionError(f"{what}: operation {where} found a different version: {exc!r}")
        raise ZkClientError(f"{what} failed at operation {index}: {exc!r}")

    def get_topics(self) -> list[str]:
        return sorted(self.kazoo.retry(self.kazoo.get_children, L.BROKER_TOPICS))

    def get_topic(self, name: str) -> tuple[str | None, dict[int, list[int]]]:
        """(topic id or None for pre-2.8 topics, {partition: replicas})."""
        try:
            data, _ = self.kazoo.retry(self.kazoo.get, L.topic_path(name))
        except NoNodeError:
            raise TopicNotFoundError(name) from None
        assignment = L.decode_topic(data)
        return assignment.topic_id, assignment.partitions

    def get_partition_state(self, topic: str, partition: int) -> tuple[L.PartitionState, int]:
        """(state, zk version); pass the version to set_partition_state for a CAS write."""
        try:
            data, stat = self.kazoo.retry(self.kazoo.get, L.partition_state_path(topic, partition))
        except NoNodeError:
            raise PartitionNotFoundError(f"{topic}-{partition}") from None
        return L.decode_partition_state(data), stat.version

    def set_partition_state(self, topic: str, partition: int, state: L.PartitionState,
                            expected_version: int) -> int:
        """Compare-and-set the partition state; return the new zk version.

        Raises StaleVersionError if someone wrote since ``expected_version`` (a
        zombie leader cannot overwrite a newer ISR).
        """
        try:
            stat = self.kazoo.set(L.partition_state_path(topic, partition), L.encode_partition_state(state),
                                  version=expected_version)
        except BadVersionError:
            raise StaleVersionError(f"{topic}-{partition} state is not at version {expected_version}") from None
        except NoNodeError:
            raise PartitionNotFoundError(f"{topic}-{partition}") from None
        return stat.version

    def notify_isr_change(self, partitions) -> str:
        """Tell the controller a leader changed ISRs: a persistent sequential
        /isr_change_notification/isr_change_<seq> naming ``partitions`` [(topic, p)]."""
        return self.kazoo.retry(self.kazoo.create, L.ISR_CHANGE_PREFIX, L.encode_partition_list(partitions),
                                sequence=True, makepath=True)

    def notify_log_dir_failure(self, broker_id: int) -> str:
        """Tell the controller a log dir of this broker failed: a persistent sequential
        /log_dir_event_notification/log_dir_event_<seq>."""
        return self.kazoo.retry(self.kazoo.create, L.LOG_DIR_EVENT_PREFIX, L.encode_log_dir_event(broker_id),
                                sequence=True, makepath=True)

    def read_log_dir_events(self) -> dict[str, tuple[int, int]]:
        """{child name: (broker id, event)} under /log_dir_event_notification (unreadable ones: (-1, -1))."""
        zk = self.kazoo
        out = {}
        for child in sorted(zk.retry(zk.get_children, L.LOG_DIR_EVENT_NOTIFICATION)):
            try:
                data, _ = zk.retry(zk.get, f"{L.LOG_DIR_EVENT_NOTIFICATION}/{child}")
            except NoNodeError:
                continue
            try:
                out[child] = L.decode_log_dir_event(data)
            except (ValueError, KeyError, TypeError):
                log.error("unreadable %s/%s: %r", L.LOG_DIR_EVENT_NOTIFICATION, child, data)
                out[child] = (-1, -1)
        return out

    def add_partitions(self, name: str, new_assignment: dict[int, list[int]]) -> dict[int, list[int]]:
        """Add partitions to the assignment (admin write). ``new_assignment`` holds only the new
        partitions, numbered on from the current count. Returns the full assignment; the
        controller creates the new partitions' states."""
        zk = self.kazoo
        try:
            data, stat = zk.retry(zk.get, L.topic_path(name))
        except NoNodeError:
            raise TopicNotFoundError(name) from None
        current = L.decode_topic(data)
        _check_assignment(new_assignment, start=len(current.partitions))
        full = {**current.partitions, **{int(p): list(r) for p, r in new_assignment.items()}}
        try:
            # CAS on the topic znode: two concurrent adds cannot both win.
            zk.set(L.topic_path(name), L.encode_topic(full, current.topic_id, current.adding_replicas,
                                                     current.removing_replicas), version=stat.version)
        except BadVersionError:
            raise StaleVersionError(f"topic {name!r} changed concurrently") from None
        except NoNodeError:
            raise TopicNotFoundError(name) from None
        return full

    def get_topic_config(self, name: str) -> dict[str, str]:
        """The topic's overrides ({} if none)."""
        try:
            data, _ = self.kazoo.retry(self.kazoo.get, L.topic_config_path(name))
        except NoNodeError:
            return {}
        return L.decode_config(data)

    def set_topic_config(self, name: str, configs: dict[str, str]) -> None:
        """Replace the topic's overrides and post a change notification (one multi-op)."""
        zk = self.kazoo
        data = L.encode_config(configs)
        for _ in range(10):
            config_stat = zk.retry(zk.exists, L.topic_config_path(name))
            tx = zk.transaction()
            tx.check(L.topic_path(name), -1)  # -1: any version, i.e. "the topic exists"
            if config_stat is None:
                tx.create(L.topic_config_path(name), data)
            else:
                tx.set_data(L.topic_config_path(name), data, version=config_stat.version)
            tx.create(L.CONFIG_CHANGE_PREFIX, L.encode_config_change("topics", name), sequence=True)
            failure = _failed(tx.commit())
            if failure is None:
                return
            index, exc = failure
            if index == 0:
                raise TopicNotFoundError(name)
            if not isinstance(exc, (BadVersionError, NodeExistsError, NoNodeError)):
                raise ZkClientError(f"setting config of {name!r} failed: {exc!r}")
            # a concurrent config write: read the version again
        raise StaleVersionError(f"config of {name!r} kept changing")

    def get_broker_config(self, entity: str) -> dict[str, str]:
        """Dynamic broker configs of ``entity`` (a broker id or "<default>"); {} if none."""
        try:
            data, _ = self.kazoo.retry(self.kazoo.get, L.broker_config_path(entity))
        except NoNodeError:
            return {}
        return L.decode_config(data)

    def alter_broker_config(self, entity: str, set_: dict[str, str], delete=()) -> dict[str, str]:
        """Set and remove dynamic broker configs of ``entity`` and post a "brokers/<entity>" change
        notification, in one multi-op (CAS on the config znode, as kafka-configs.sh writes them).
        Returns the new configs."""
        zk = self.kazoo
        path = L.broker_config_path(entity)
        zk.retry(zk.ensure_path, L.CONFIG_BROKERS)
        for _ in range(10):
            try:
                data, stat = zk.retry(zk.get, path)
                current = L.decode_config(data)
            except NoNodeError:
                stat, current = None, {}
            new = {k: v for k, v in current.items() if k not in set(delete)}
            new.update(set_)
            tx = zk.transaction()
            if stat is None:
                tx.create(path, L.encode_config(new))
            else:
                tx.set_data(path, L.encode_config(new), version=stat.version)
            tx.create(L.CONFIG_CHANGE_PREFIX, L.encode_config_change("brokers", str(entity)), sequence=True)
            failure = _failed(tx.commit())
            if failure is None:
                return new
            _index, exc = failure
            if not isinstance(exc, (BadVersionError, NodeExistsError, NoNodeError)):
                raise ZkClientError(f"setting broker config of {entity!r} failed: {exc!r}")
        raise StaleVersionError(f"broker config of {entity!r} kept changing")

    def delete_topic(self, name: str) -> None:
        """Delete a topic's znodes at once (controller only).

        Kafka marks ``/admin/delete_topics/<t>`` and its controller deletes after
        every replica stopped. A lone broker is the only replica holder, so the
        controller removes state, partitions, assignment and config in one
        fenced multi-op (and a pending ``/admin/delete_topics`` mark, if any).
        The broker deletes the log itself.
        """
        zk = self.kazoo
        for _ in range(10):
            try:
                partitions = zk.retry(zk.get_children, L.topic_partitions_path(name))
            except NoNodeError:
                partitions = None
            if partitions is None and zk.retry(zk.exists, L.topic_path(name)) is None:
                raise TopicNotFoundError(name)
            tx = zk.transaction()
            self._controller_check(tx)
            for p in sorted(partitions or [], key=int):
                tx.delete(L.partition_state_path(name, int(p)))
                tx.delete(L.partition_path(name, int(p)))
            if partitions is not None:
                tx.delete(L.topic_partitions_path(name))
            tx.delete(L.topic_path(name))
            if zk.retry(zk.exists, L.topic_config_path(name)) is not None:
                tx.delete(L.topic_config_path(name))
            if zk.retry(zk.exists, L.delete_topic_path(name)) is not None:
                tx.delete(L.delete_topic_path(name))
            failure = _failed(tx.commit())
            if failure is None:
                return
            index, exc = failure
            if index == 0 and isinstance(exc, BadVersionError):
                raise self._controller_moved()
            if not isinstance(exc, (NoNodeError, NotEmptyError)):
                raise ZkClientError(f"deleting topic {name!r} failed: {exc!r}")
            # partitions were added or a node vanished meanwhile: look again
        raise ZkClientError(f"deleting topic {name!r} did not settle")

    def watch_topics(self, callback: Callable[[list[str]], None]) -> None:
        """Call ``callback(sorted topic names)`` now and on every change of /brokers/topics.

        Survives session expiry (kazoo's ChildrenWatch re-arms itself).
        """
        def on_children(children):
            if self._closing.is_set():
                return False  # stops the watch
            self._deliver(callback, sorted(children))
            return None

        self.kazoo.ChildrenWatch(L.BROKER_TOPICS, on_children)

    def watch_children(self, path: str, callback: Callable[[list[str]], None],
                       active: Callable[[], bool] = lambda: True) -> None:
        """Call ``callback(sorted children)`` (on the loop) now and on every change of ``path``
        (created if missing) until ``active()`` turns false. kazoo's thread only hands over."""
        self.kazoo.retry(self.kazoo.ensure_path, path)

        def on_children(children):
            if self._closing.is_set() or not active():
                return False  # stops the watch
            self._deliver(callback, sorted(children))
            return None

        self.kazoo.ChildrenWatch(path, on_children)

    def watch_data(self, path: str, callback: Callable[[bool], None],
                   active: Callable[[], bool] = lambda: True) -> None:
        """Call ``callback(exists)`` (on the loop) now and whenever ``path``'s data changes or it
        appears/vanishes, until ``active()`` turns false."""
        def on_data(data, stat, event=None):
            if self._closing.is_set() or not active():
                return False
            self._deliver(callback, stat is not None)
            return None

        self.kazoo.DataWatch(path, on_data)

    # --- reads for the controller -------------------------------------------

    def get_live_brokers(self) -> dict[int, tuple[L.BrokerRegistration, int]]:
        """{broker id: (registration, broker epoch = czxid)} of every registered broker."""
        zk = self.kazoo
        out = {}
        for child in zk.retry(zk.get_children, L.BROKER_IDS):
            try:
                data, stat = zk.retry(zk.get, L.broker_path(int(child)))
            except NoNodeError:
                continue
            out[int(child)] = (L.decode_broker(int(child), data), stat.czxid)
        return out

    def get_partition_states(self, topic: str, partitions) -> dict[int, tuple[L.PartitionState, int]]:
        """{partition: (state, zk version)} for the partitions whose state znode exists."""
        out = {}
        for p in partitions:
            try:
                out[p] = self.get_partition_state(topic, p)
            except PartitionNotFoundError:
                pass
        return out

    def read_config_changes(self, children) -> list[tuple[str, str]]:
        """(entity type, entity name) of the /config/changes notifications named (gone ones skipped)."""
        zk = self.kazoo
        out = []
        for child in children:
            try:
                data, _ = zk.retry(zk.get, f"{L.CONFIG_CHANGES}/{child}")
                out.append(L.decode_config_change(data))
            except NoNodeError:
                continue
            except (ValueError, KeyError, TypeError):
                log.error("unreadable config change notification %s", child)
        return out

    def get_topic_assignment(self, name: str) -> tuple[L.TopicAssignment, int]:
        """(full assignment incl. adding/removing replicas, znode version)."""
        try:
            data, stat = self.kazoo.retry(self.kazoo.get, L.topic_path(name))
        except NoNodeError:
            raise TopicNotFoundError(name) from None
        return L.decode_topic(data), stat.version

    def set_topic_assignment(self, name: str, assignment: L.TopicAssignment, expected_version: int) -> int:
        """Controller write of a topic's assignment (reassignment), fenced and CAS; new version."""
        tx = self.kazoo.transaction()
        self._controller_check(tx)
        tx.set_data(L.topic_path(name), L.encode_topic(assignment.partitions, assignment.topic_id,
                                                      assignment.adding_replicas, assignment.removing_replicas),
                    version=expected_version)
        return self._commit_fenced(tx, f"reassigning {name!r}")[1].version

    def get_reassignments(self) -> tuple[list[tuple[str, int, list[int]]], int] | None:
        """(/admin/reassign_partitions entries, version), None when no reassignment is requested."""
        try:
            data, stat = self.kazoo.retry(self.kazoo.get, L.REASSIGN_PARTITIONS)
        except NoNodeError:
            return None
        try:
            return L.decode_reassignment(data), stat.version
        except (ValueError, KeyError, TypeError):
            log.error("unreadable %s: %r", L.REASSIGN_PARTITIONS, data)
            return [], stat.version

    def request_reassignments(self, entries) -> None:
        """Operator side: create /admin/reassign_partitions; TopicExistsError-like NodeExists
        surfaces as ZkClientError (a reassignment is already in progress)."""
        try:
            self.kazoo.retry(self.kazoo.create, L.REASSIGN_PARTITIONS, L.encode_reassignment(entries), makepath=True)
        except NodeExistsError:
            raise ZkClientError("There is an existing assignment running.") from None

    def replace_reassignments(self, entries, expected_version: int) -> None:
        """Operator side (--cancel): rewrite the pending list at ``expected_version``;
        StaleVersionError when the controller (or another tool) changed it meanwhile."""
        try:
            self.kazoo.retry(self.kazoo.set, L.REASSIGN_PARTITIONS, L.encode_reassignment(entries),
                             version=expected_version)
        except (BadVersionError, NoNodeError):
            raise StaleVersionError(f"{L.REASSIGN_PARTITIONS} changed meanwhile") from None

    def set_reassignments(self, entries, expected_version: int) -> None:
        """Controller: rewrite the pending list (delete the znode when empty), fenced and CAS."""
        tx = self.kazoo.transaction()
        self._controller_check(tx)
        if entries:
            tx.set_data(L.REASSIGN_PARTITIONS, L.encode_reassignment(entries), version=expected_version)
        else:
            tx.delete(L.REASSIGN_PARTITIONS, version=expected_version)
        self._commit_fenced(tx, "updating reassignments")

    def mark_topic_for_deletion(self, name: str) -> None:
        """Ask the controller to delete a topic (/admin/delete_topics/<t>); idempotent."""
        try:
            self.kazoo.retry(self.kazoo.create, L.delete_topic_path(name), makepath=True)
        except NodeExistsError:
            pass

    def get_topic_deletions(self) -> list[str]:
        return sorted(self.kazoo.retry(self.kazoo.get_children, L.DELETE_TOPICS))

    def remove_topic_deletion(self, name: str) -> None:
        try:
            self.kazoo.retry(self.kazoo.delete, L.delete_topic_path(name))
        except NoNodeError:
            pass

    def read_partition_list_children(self, parent: str) -> dict[str, list[tuple[str, int]]]:
        """{child name: [(topic, partition)]} of notification nodes under ``parent``."""
        zk = self.kazoo
        out = {}
        for child in sorted(zk.retry(zk.get_children, parent)):
            try:
                data, _ = zk.retry(zk.get, f"{parent}/{child}")
            except NoNodeError:
                continue
            try:
                out[child] = L.decode_partition_list(data)
            except (ValueError, KeyError, TypeError):
                log.error("unreadable %s/%s: %r", parent, child, data)
                out[child] = []
        return out

    def read_partition_list(self, path: str) -> list[tuple[str, int]] | None:
        """The partitions listed at ``path`` (None if it does not exist)."""
        try:
            data, _ = self.kazoo.retry(self.kazoo.get, path)
        except NoNodeError:
            return None
        try:
            return L.decode_partition_list(data)
        except (ValueError, KeyError, TypeError):
            log.error("unreadable %s: %r", path, data)
            return []

    def delete_nodes(self, paths) -> None:
        """Delete notification/request znodes (already gone is fine)."""
        for path in paths:
            try:
                self.kazoo.retry(self.kazoo.delete, path)
            except NoNodeError:
                pass

    # --- producer ids ------------------------------------------------------

    def allocate_producer_id_block(self, block_size: int = 1000) -> tuple[int, int]:
        """Reserve the next ``block_size`` producer ids; returns (first, last) inclusive.

        Reads ``/latest_producer_id_block`` and writes the following block at the
        read version; a concurrent allocation makes the write fail and we retry,
        so no two callers (or restarts) ever get overlapping blocks.
        """
        zk = self.kazoo
        while True:
            try:
                data, stat = zk.retry(zk.get, L.LATEST_PRODUCER_ID_BLOCK)
            except NoNodeError:
                data, stat = None, None
            previous = L.decode_producer_id_block(data)
            start = 0 if previous is None else previous.end + 1
            end = start + block_size - 1
            if end > 2 ** 63 - 1:
                raise ZkClientError("producer ids exhausted")
            block = L.encode_producer_id_block(L.ProducerIdBlock(self.broker_id, start, end))
            try:
                if stat is None:
                    zk.create(L.LATEST_PRODUCER_ID_BLOCK, block, makepath=True)
                else:
                    zk.set(L.LATEST_PRODUCER_ID_BLOCK, block, version=stat.version)
                return start, end
            except (BadVersionError, NodeExistsError):
                continue  # someone else took this block: read theirs and go on from it


def _failed(results: list) -> tuple[int, Exception] | None:
    """The first real failure of a committed multi-op (others report RolledBackError)."""
    for i, r in enumerate(results):
        if isinstance(r, Exception) and not isinstance(r, RolledBackError):
            return i, r
    for i, r in enumerate(results):
        if isinstance(r, Exception):
            return i, r
    return None


def _check_assignment(assignment: dict[int, list[int]], start: int) -> None:
    if not assignment:
        raise ValueError("an assignment needs at least one partition")
    if sorted(int(p) for p in assignment) != list(range(start, start + len(assignment))):
        raise ValueError(f"partitions must be numbered {start}..{start + len(assignment) - 1}")
    for p, replicas in assignment.items():
        if not replicas or len(set(replicas)) != len(replicas):
            raise ValueError(f"partition {p}: replicas must be a non-empty list without duplicates")


__all__ = ["BrokerZk", "ZkClientError", "BrokerRegistrationError", "TopicExistsError", "TopicNotFoundError",
           "PartitionNotFoundError", "StaleVersionError", "NotControllerError"]
