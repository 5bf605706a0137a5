"""Wake-ups for long-polling fetches: an append to a partition resolves every future waiting on it."""
from __future__ import annotations

import asyncio


class AppendNotifier:
    def __init__(self):
        self._waiters: dict[tuple[str, int], list[asyncio.Future]] = {}

    def waiter(self, tps) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        for tp in tps:
            self._waiters.setdefault(tp, []).append(fut)
        return fut

    def forget(self, tps, fut) -> None:
        for tp in tps:
            lst = self._waiters.get(tp)
            if lst:
                try:
                    lst.remove(fut)
                except ValueError:
                    pass
                if not lst:
                    del self._waiters[tp]

    def appended(self, tp) -> None:
        lst = self._waiters.pop(tp, None)
        if lst:
            for fut in lst:
                if not fut.done():
                    fut.set_result(None)
