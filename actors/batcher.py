"""Batches the next generations of many concurrent episodes into one policy call.

Episodes `await batcher.generate(policy, prompt, params)`. A background task (`run`) takes the waiting requests
of one policy (one weights version: an episode keeps the version it started with, so two versions may be
waiting at once; the oldest request's version goes first), up to `max_batch`, and calls `policy.generate` on
one worker thread, so the event loop keeps driving sandbox calls while the sampler works.

When to call: as soon as every episode that is not inside a tool call is waiting (nothing more can join), or
`gather_s` after the oldest waiting request, whichever comes first; requests that waited through a call go
in the next call at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import time
from typing import Any, Sequence

from actors.activity import ActivityClock


@dataclasses.dataclass(eq=False)
class _Request:
    policy: Any
    prompt: Sequence[int]
    params: Any
    future: asyncio.Future
    at: float


class GenerationBatcher:
    """See the module doc.

    Args:
      max_batch: most sequences per policy call.
      gather_s: longest wait for more requests once one is waiting.
      clock: records sampler busy time (activity "sampling").

    Attributes the actor keeps current: `episodes` (episodes running) and `in_tools` (those inside tool calls);
    a call starts without waiting once `episodes - in_tools` requests are waiting.
    Counters in `stats`: calls, sequences, max_batch_seen, gather_waits.
    """

    def __init__(self, max_batch: int = 64, gather_s: float = 0.02, clock: ActivityClock | None = None):
        if max_batch < 1 or gather_s < 0:
            raise ValueError("max_batch must be >= 1 and gather_s >= 0")
        self.max_batch = max_batch
        self.gather_s = gather_s
        self.clock = clock
        self.episodes = 0
        self.in_tools = 0
        self.stats = {"calls": 0, "sequences": 0, "max_batch_seen": 0, "gather_waits": 0, "generate_s": 0.0}
        self._pending: list[_Request] = []
        self._wake: asyncio.Event | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def reset(self) -> None:
        """Forget waiting requests and bind to the running event loop (call before `run` on a new loop)."""
        self._pending = []
        self._wake = asyncio.Event()

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    async def generate(self, policy: Any, prompt: Sequence[int], params: Any) -> Any:
        """One completion of `prompt` by `policy` (batched with other episodes' requests)."""
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(policy, prompt, params, fut, time.monotonic()))
        self._event().set()
        return await fut

    def _expected(self) -> int:
        return max(1, self.episodes - self.in_tools)

    async def run(self) -> None:
        """Serve requests until cancelled."""
        loop = asyncio.get_running_loop()
        wake = self._event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sampler")
        try:
            await self._serve(loop, wake)
        finally:
            self.close()

    async def _serve(self, loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> None:
        carried: set[int] = set()
        while True:
            await wake.wait()
            wake.clear()
            self._pending = [r for r in self._pending if not r.future.done()]  # cancelled episodes
            if not self._pending:
                continue
            end = min(r.at for r in self._pending) + self.gather_s
            if any(id(r) in carried for r in self._pending):
                end = 0.0  # requests that waited through a whole call go at once
            while len(self._pending) < min(self._expected(), self.max_batch) and time.monotonic() < end:
                self.stats["gather_waits"] += 1
                await asyncio.sleep(min(0.002, max(0.0, end - time.monotonic())))
            policy = self._pending[0].policy
            batch = [r for r in self._pending if r.policy is policy][:self.max_batch]
            taken = set(map(id, batch))
            self._pending = [r for r in self._pending if id(r) not in taken]
            carried = set(map(id, self._pending))
            if self._pending:
                wake.set()
            await self._call(loop, policy, batch)

    async def _call(self, loop: asyncio.AbstractEventLoop, policy: Any, batch: list[_Request]) -> None:
        prompts = [r.prompt for r in batch]
        params = [r.params for r in batch]
        if self.clock is not None:
            self.clock.start("sampling")
        t0 = time.perf_counter()
        try:
            outs = await loop.run_in_executor(self._executor, policy.generate, prompts, params)
            if len(outs) != len(batch):
                raise RuntimeError(f"policy {getattr(policy, 'name', policy)} returned {len(outs)} completions for "
                                   f"{len(batch)} prompts")
        except Exception as e:  # noqa: BLE001 - every episode of the batch gets the error
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(e)
            return
        finally:
            if self.clock is not None:
                self.clock.stop("sampling")
            self.stats["generate_s"] += time.perf_counter() - t0
        self.stats["calls"] += 1
        self.stats["sequences"] += len(batch)
        self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], len(batch))
        for r, out in zip(batch, outs):
            if r.future.done():
                continue
            if isinstance(out, BaseException):  # this sequence failed alone (e.g. one HTTP request)
                r.future.set_exception(out)
            else:
                r.future.set_result(out)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
