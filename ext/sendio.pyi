"""Native send step for answers of bytes chunks and file ranges; see sendio.pyx."""
from typing import Any, Iterable

class SendCursor:
    index: int
    offset: int
    remaining: int
    def __init__(self, chunks: Iterable[Any]) -> None: ...
    @property
    def done(self) -> bool: ...
    def send(self, sock_fd: int, metrics: Any = None) -> bool: ...
