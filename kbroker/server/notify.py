"""Wake-ups for long-polling fetches: an append to a partition resolves every future waiting on it."""
from __future__ import annotations

import asyncio


class AppendNotifier:
    def __init__(self):
        # tp -> its waiters' futures; public because the native Produce path (FastProduce) holds this
        # dict to skip ``appended`` for a partition nobody waits on: never replaced, only changed here
        self.waiters: dict[tuple[str, int], list[asyncio.Future]] = {}

    def waiter(self, tps) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        for tp in tps:
            self.waiters.setdefault(tp, []).append(fut)
        return fut

    def forget(self, tps, fut) -> None:
        for tp in tps:
            lst = self.waiters.get(tp)
            if lst:
                try:
                    lst.remove(fut)
                except ValueError:
                    pass
                if not lst:
                    del self.waiters[tp]

    def appended(self, tp) -> None:
        lst = self.waiters.pop(tp, None)
        if lst:
            for fut in lst:
                if not fut.done():
                    fut.set_result(None)
