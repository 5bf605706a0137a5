"""Native TLS reads of a server-side ssl.SSLObject; see tls.pyx."""
import ssl
from typing import Any

WANT_READ: int
STOPPED: int
CLOSE_NOTIFY: int

class TlsUnsupported(Exception): ...
class TlsError(Exception): ...

def library_problem(ssl_module_file: str, python_version_number: int) -> str | None: ...

class TlsReader:
    paused: bool
    bytes_read: int
    calls: int
    def __init__(self, sslobj: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> None: ...
    def receive(self, data: Any, nbytes: int, conn: Any) -> int: ...
    def drain(self, conn: Any) -> int: ...
