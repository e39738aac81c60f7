"""The floor of the asyncio API's shape for one CTP unit, no engine behind it (``ctp-floor``).

Issue 10's asyncio target (>= 5x SQLite's best, i.e. about 17-20k units/s on
this machine) is a budget of about 50-60 us of event-loop time per unit. This
measures what the API's *shape* costs by itself, so the rest of the budget is
known to belong to the engine: 64 tasks, each unit one ``await`` of a
receive, a send and an ack that complete at once (a message already buffered,
a send that only queues, an ack that only holds) and one ``await`` of a
commit that suspends until ANOTHER thread resolves it -- in bursts, through
``call_soon_threadsafe``, as the coordinator's asyncio front end does. No
storage, no transaction state, no Python futures per write.

``python benches/test_ctp_floor.py [units]`` prints units/s and us per unit.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
from typing import Any

CONCURRENCY = 64
UNITS = 40_000
SMOKE_UNITS = 2_000


async def _floor(units: int, concurrency: int) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    ends: queue.SimpleQueue[asyncio.Future[None] | None] = queue.SimpleQueue()

    def resolve(batch: list[asyncio.Future[None]]) -> None:
        for f in batch:
            if not f.done():
                f.set_result(None)

    def coordinator() -> None:
        # Ends every commit queued meanwhile with one wake of the loop.
        while True:
            first = ends.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    f = ends.get_nowait()
                except queue.Empty:
                    break
                if f is None:
                    loop.call_soon_threadsafe(resolve, batch)
                    return
                batch.append(f)
            loop.call_soon_threadsafe(resolve, batch)

    thread = threading.Thread(target=coordinator, daemon=True)
    thread.start()
    left = units
    committed = 0

    async def receive() -> bytes:
        return b"input"

    async def send(value: bytes) -> int:
        return len(value)

    async def ack(msg: bytes) -> None:
        return None

    async def commit() -> None:
        f: asyncio.Future[None] = loop.create_future()
        ends.put(f)
        await f

    async def stream() -> None:
        nonlocal left, committed
        while left > 0:
            left -= 1
            msg = await receive()
            await send(msg)
            await ack(msg)
            await commit()
            committed += 1

    start = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    ends.put(None)
    thread.join(10)
    return seconds, committed


def api_floor(units: int = UNITS, concurrency: int = CONCURRENCY) -> dict[str, float]:
    """Run the floor once: ``units_per_s`` and ``us_per_unit``; every commit must have ended."""
    seconds, committed = asyncio.run(_floor(units, concurrency))
    if committed != units:
        raise RuntimeError(f"{committed} of {units} commits ended")
    return {"units_per_s": units / seconds, "us_per_unit": seconds / units * 1e6}


def test_ctp_api_floor(benchmark: Any) -> None:
    benchmark.group = "ctp-floor"
    units = SMOKE_UNITS if benchmark.disabled else UNITS
    got: list[dict[str, float]] = []
    benchmark.pedantic(lambda: got.append(api_floor(units)), rounds=3, iterations=1)
    assert got  # api_floor raises unless every commit ended
    best = max(got, key=lambda g: g["units_per_s"])
    benchmark.extra_info.update(items=units, **best)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else UNITS
    r = api_floor(n)
    print(f"{r['units_per_s']:,.0f} units/s ({r['us_per_unit']:.1f} us per unit), {n} units")
