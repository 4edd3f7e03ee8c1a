"""Weight publication that does not stall training: device -> pinned host copies, then the protocol's
`WeightsPublisher`, on a background thread.

`AsyncWeightPublisher.submit(version, params)` is all the training loop pays: it casts the parameters on the
device (optional, e.g. to bfloat16), and *starts* their copy to pinned host memory (`jax.device_put` to a
`pinned_host` memory-kind sharding, about 50 GB/s on an H200 host against about 2 GB/s for JAX's default
device-to-host path, per shared/STACK_NOTES.md). A worker thread waits for the copies, hands the host arrays to
`WeightsPublisher.publish` (chunking + crc32) and the actors pull them while the next update runs. JAX arrays
are immutable, so the next optimiser step cannot overwrite weights that are still being copied.

When a new version is submitted before the previous one went out, the older pending one is skipped (actors
only ever want the newest). Timings in `stats`: blocked_s (the caller's cost of the last submit), d2h_s,
publish_s, total_s (submit -> published).

Tensor names: the NNX state path of each `nnx.Param` joined with "/" (e.g. "backbone/layers/wq"), the naming
the actors load (actors.weights.model_from_tensors).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Mapping, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

log = logging.getLogger(__name__)

PUBLISH_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class Publisher(Protocol):
    def publish(self, version: int, tensors: Mapping[str, np.ndarray]) -> Any: ...


def param_tensors(params: Any) -> dict[str, jax.Array]:
    """name -> device array of every parameter in an `nnx.State` of `nnx.Param`s (or a module)."""
    if isinstance(params, nnx.Module):
        params = nnx.state(params, nnx.Param)
    return {"/".join(map(str, path)): var.get_value() for path, var in nnx.to_flat_state(params)}


def _supports_pinned_host(x: jax.Array) -> bool:
    try:
        return all("pinned_host" in {m.kind for m in d.addressable_memories()} for d in x.sharding.device_set)
    except Exception:  # backends without memory spaces
        return False


@jax.jit
def _cast_all(arrays: dict, dtype_token: jax.Array):
    return jax.tree.map(lambda a: a.astype(dtype_token.dtype), arrays)


def start_host_copy(arrays: Mapping[str, jax.Array], dtype: str | None = None) -> dict[str, jax.Array]:
    """Cast (on device) and start the copy of each array to pinned host memory; returns the host-side arrays
    (their `np.asarray` waits for the copy and is zero-copy). Arrays spread over several processes are
    gathered first (every process must call this then)."""
    out = dict(arrays)
    if dtype is not None:
        if dtype not in PUBLISH_DTYPES:
            raise ValueError(f"publish dtype must be one of {sorted(PUBLISH_DTYPES)}, got {dtype!r}")
        out = _cast_all(out, jnp.zeros((), PUBLISH_DTYPES[dtype]))
    for name, x in out.items():
        if not x.is_fully_addressable:
            from jax.experimental import multihost_utils

            x = multihost_utils.process_allgather(x, tiled=True)
            out[name] = x
            continue
        if _supports_pinned_host(x):
            out[name] = jax.device_put(x, x.sharding.with_memory_kind("pinned_host"))
        else:
            x.copy_to_host_async()
    return out


class AsyncWeightPublisher:
    """Background publication of policy weights (module docstring).

    Args:
      publisher: where versions go (a started `protocol.weights_channel.WeightsPublisher`).
      dtype: cast to this dtype before the copy ("bfloat16" halves the bytes), or None to keep the
        parameters' dtype.
      enabled: False in non-zero processes of a multi-host learner (they still join the gathers).
    """

    def __init__(self, publisher: Publisher, dtype: str | None = None, enabled: bool = True):
        self.publisher = publisher
        self.dtype = dtype
        self.enabled = enabled
        self.stats: dict[str, float] = {"submitted": 0, "published": 0, "skipped": 0, "errors": 0,
                                        "blocked_s": 0.0, "d2h_s": 0.0, "publish_s": 0.0, "total_s": 0.0,
                                        "bytes": 0, "version": -1}
        self._cv = threading.Condition()
        self._pending: tuple[int, dict, float] | None = None
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="weights-publish", daemon=True)
        self._thread.start()

    def submit(self, version: int, params: Any) -> float:
        """Queue `params` (nnx.State / module) as `version`; returns the seconds the caller was blocked."""
        t0 = time.perf_counter()
        host = start_host_copy(param_tensors(params), self.dtype)
        blocked = time.perf_counter() - t0
        with self._cv:
            self.stats["submitted"] += 1
            self.stats["blocked_s"] = blocked
            if not self.enabled:
                return blocked
            if self._pending is not None:
                self.stats["skipped"] += 1
            self._pending = (version, host, t0)
            self._cv.notify_all()
        return blocked

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                version, host, t0 = self._pending
                self._pending = None
                self._busy = True
            try:
                t1 = time.perf_counter()
                tensors = {k: np.asarray(v) for k, v in host.items()}
                t2 = time.perf_counter()
                self.publisher.publish(version, tensors)
                t3 = time.perf_counter()
                with self._cv:
                    self.stats.update(published=self.stats["published"] + 1, d2h_s=t2 - t1, publish_s=t3 - t2,
                                      total_s=t3 - t0, bytes=sum(a.nbytes for a in tensors.values()), version=version)
            except Exception:  # a failed publish must not kill training: log, count, go on
                log.exception("weights version %d: publication failed", version)
                with self._cv:
                    self.stats["errors"] += 1
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until nothing is pending or in flight; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._pending is None and not self._busy, timeout=timeout_s)

    def close(self) -> None:
        """Publish what is pending, then stop the thread."""
        self.wait()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=10)
