"""Policy weights on the actor: the tensor naming used on the weights channel, the versions an actor holds, and
the refresh from the learner's publisher.

Naming: a `learner.model.Transformer`'s parameters travel as `{"backbone/layers/wq": array, ...}` (the NNX
state path joined with "/"), `policy_tensors(model)` on the learner side, `model_from_tensors(config, tensors)`
here. Any dtype the protocol carries (bf16 included) is accepted and cast to the config's parameter dtype.

Versions (`PolicyVersions`): new episodes take the newest version; an episode keeps the version it started with
to its end, so while a refresh is under way the actor holds two versions (more only if episodes outlive
several refreshes), and drops an old one when its last episode ends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable, Mapping

import numpy as np

log = logging.getLogger(__name__)


def policy_tensors(model: Any) -> dict[str, np.ndarray]:
    """name -> host array of every parameter of a Transformer (what `WeightsPublisher.publish` takes)."""
    from flax import nnx

    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {"/".join(map(str, path)): np.asarray(var.get_value()) for path, var in flat}


def model_from_tensors(config: Any, tensors: Mapping[str, np.ndarray]) -> Any:
    """A Transformer of `config` holding `tensors` (from `policy_tensors` / a `WeightsUpdate`).

    Raises ValueError naming a missing, unexpected or wrongly shaped tensor.
    """
    import jax.numpy as jnp
    from flax import nnx

    from learner.model import Transformer

    abstract = nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    filled, seen = [], set()
    for path, var in nnx.to_flat_state(state):
        name = "/".join(map(str, path))
        if name not in tensors:
            raise ValueError(f"weights: tensor {name!r} is missing (have {len(tensors)} tensors)")
        arr = tensors[name]
        want = tuple(var.get_value().shape)
        if tuple(arr.shape) != want:
            raise ValueError(f"weights: tensor {name!r} has shape {tuple(arr.shape)}, the model needs {want}")
        filled.append((path, var.replace(jnp.asarray(arr, dtype=var.get_value().dtype))))
        seen.add(name)
    extra = sorted(set(tensors) - seen)
    if extra:
        raise ValueError(f"weights: unexpected tensor(s) {extra[:5]} for this model config")
    return nnx.merge(graphdef, nnx.from_flat_state(filled))


def random_policy_tensors(config: Any, seed: int = 0, std: float | None = None) -> dict[str, np.ndarray]:
    """Random weights for `config` in the naming of `policy_tensors`, drawn with NumPy (tests and benchmarks:
    no JAX random-number compilation, which costs seconds per shape on a small CPU). Norm scales are 1, the
    q/k/v biases 0, other matrices normal(0, std) (default config.init_std), in the parameter dtype."""
    import ml_dtypes
    from flax import nnx

    from learner.model import Transformer

    abstract = nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0)))
    rng = np.random.default_rng(seed)
    dtype = np.dtype(ml_dtypes.bfloat16) if config.param_dtype == "bfloat16" else np.dtype(np.float32)
    std = config.init_std if std is None else std
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
        name, shape = "/".join(map(str, path)), tuple(var.get_value().shape)
        if str(path[-1]).endswith("norm"):
            arr = np.ones(shape, np.float32)
        elif path[-1] in ("bq", "bk", "bv"):
            arr = np.zeros(shape, np.float32)
        else:
            arr = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        out[name] = arr.astype(dtype)
    return out


class PolicyVersions:
    """The policies (one per weights version) an actor holds, with how many episodes use each.

    `set(policy)` makes it the newest; `acquire()` gives the newest to a new episode; `release(policy)` when the
    episode ends drops an old version nobody uses any more. Thread-safe.
    """

    def __init__(self, policy: Any | None = None):
        self._lock = threading.Lock()
        self._newest: Any | None = None
        self._users: dict[int, list] = {}  # id(policy) -> [policy, episodes using it]
        self._ready = threading.Event()
        self.swaps = 0
        if policy is not None:
            self.set(policy)

    @property
    def newest(self) -> Any | None:
        return self._newest

    @property
    def newest_version(self) -> int:
        p = self._newest
        return int(getattr(p, "version", -1)) if p is not None else -1

    def held_versions(self) -> list[int]:
        """Versions held now (the newest and any still used by an episode), ascending."""
        with self._lock:
            return sorted(int(getattr(p, "version", -1)) for p, _ in self._users.values())

    def set(self, policy: Any) -> None:
        with self._lock:
            old = self._newest
            self._newest = policy
            self._users.setdefault(id(policy), [policy, 0])
            if old is not None and old is not policy:
                self.swaps += 1
                if self._users.get(id(old), [None, 0])[1] == 0:
                    self._users.pop(id(old), None)
        self._ready.set()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        return self._ready.wait(timeout_s)

    def acquire(self) -> Any:
        """The newest policy, counted as used by one more episode. Raises RuntimeError when none is set yet."""
        with self._lock:
            if self._newest is None:
                raise RuntimeError("no policy yet (no weights version received)")
            entry = self._users[id(self._newest)]
            entry[1] += 1
            return entry[0]

    def release(self, policy: Any) -> None:
        with self._lock:
            entry = self._users.get(id(policy))
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0 and policy is not self._newest:
                del self._users[id(policy)]


class WeightsRefresher:
    """Pulls newer weights from the learner's publisher and turns them into a policy.

    fetcher: a `protocol.weights_channel.WeightsFetcher`; make_policy(update) -> policy (e.g. build a model with
    `model_from_tensors`, a Sampler and a `JaxPolicy` of `update.version`). `poll()` is blocking (run it in a
    thread); it returns a new policy or None, and never raises: a learner that is away is logged and counted
    (failures), a version whose tensors do not fit the model is refused (logged, counted, not fetched again).
    Counters in `stats`: polls, fetched, failures, refused.
    """

    def __init__(self, fetcher: Any, make_policy: Callable[[Any], Any], timeout_s: float = 10.0):
        self.fetcher = fetcher
        self.make_policy = make_policy
        self.timeout_s = timeout_s
        self.version = -1
        self.refused_version = -1
        self.stats = {"polls": 0, "fetched": 0, "failures": 0, "refused": 0}

    def poll(self) -> Any | None:
        self.stats["polls"] += 1
        try:
            update = self.fetcher.fetch(max(self.version, self.refused_version), timeout_s=self.timeout_s)
        except Exception as e:  # noqa: BLE001 - learner away or restarting: keep the current weights
            self.stats["failures"] += 1
            log.warning("weights: no update from the learner (%s: %s); keeping version %d", type(e).__name__, e,
                        self.version)
            return None
        if update is None:
            return None
        try:
            policy = self.make_policy(update)
        except Exception as e:  # noqa: BLE001 - e.g. tensors that do not fit the model config: keep the old ones
            self.stats["refused"] += 1
            self.refused_version = update.version
            log.error("weights: version %d refused (%s: %s); keeping version %d", update.version, type(e).__name__,
                      e, self.version)
            return None
        self.version = update.version
        self.stats["fetched"] += 1
        log.info("weights: version %d received (%d tensors)", update.version, len(update.tensors))
        return policy

    async def run(self, versions: PolicyVersions, every_s: float, stop: asyncio.Event | None = None) -> None:
        """Poll every `every_s` seconds (in a worker thread) and install what arrives, until cancelled."""
        loop = asyncio.get_running_loop()
        while stop is None or not stop.is_set():
            try:
                policy = await loop.run_in_executor(None, self.poll)
            except asyncio.CancelledError:
                # the poll's thread keeps running, and asyncio.run() waits for it on the way out: a fetch from a
                # learner that has gone (a stage's end) would hold an aborted actor's exit for its whole timeout
                abandon = getattr(self.fetcher, "abandon", None)
                if abandon is not None:
                    abandon()
                raise
            if policy is not None:
                versions.set(policy)
            await asyncio.sleep(every_s if versions.newest is not None else min(every_s, 0.5))
