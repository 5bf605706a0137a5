# EXPERIMENT ONLY (not part of kbroker; copy as sitecustomize.py into $UVLOOP_PATCH_DIR): lets the network
# layer run on uvloop so the two loops can be measured. Under uvloop: asyncio's own accept (create_server)
# instead of kbroker's accept loop on private selector APIs, and file regions sent by pread + transport.write.
import asyncio
import os

try:
    from kbroker.network import server as _srv, connection as _conn
except Exception:      # noqa: BLE001
    _srv = None

if _srv is not None:
    _orig_start = _srv.KafkaServer.start

    async def start(self):
        loop = asyncio.get_running_loop()
        if hasattr(loop, "_add_reader"):
            return await _orig_start(self)
        self.loop = loop
        self._server = await loop.create_server(self._new_connection, self.host or None, self.port,
                                                reuse_address=True, backlog=128)
        self.port = self._server.sockets[0].getsockname()[1]
        self._listen = []
        self._sweeper = loop.create_task(self._sweep())
        self._hangup_watch = loop.create_task(self._watch_hangups())
        _srv.log.info("listening on %s:%d (uvloop experiment: asyncio accept)", self.host or "*", self.port)

    _srv.KafkaServer.start = start

    async def _write_via_transport(self, chunks):
        transport = self.transport
        metrics = self.server.metrics
        for c in chunks:
            if self.closed:
                return
            if not isinstance(c, _conn.FileRegions):
                transport.write(c)
                continue
            for fd, pos, length in c.regions:
                file_fd = fd if isinstance(fd, int) else fd.fileno()
                data = os.pread(file_fd, length, pos)
                metrics.fetch_copy_bytes += len(data)
                if len(data) != length:
                    raise ConnectionError("segment shrank under a fetch")
                transport.write(data)

    _conn.Connection._write_via_transport = _write_via_transport
