"""Orbax checkpoints of the learner: exact resume, and restore onto another device mesh.

A checkpoint at update `step` holds the items
  policy     TrainState arrays of the actor (step, params, rest, opt_state),
  critic     the same for the critic (optional),
  reference  the frozen reference policy's params (optional; only when the KL term is on),
  meta       JSON: policy version, stage, data position (opaque to this module: the service's spool offset),
             the PRNG key, and free-form extras (e.g. the resolved config).
Static parts of a TrainState (graph, optimiser, schedule, PPO config) are not stored: the caller rebuilds them
from its config and passes a restore *target*, whose arrays may be abstract (`jax.ShapeDtypeStruct`) and carry
the shardings of the new mesh; Orbax reads each shard from the files it lies in, so a checkpoint written on
8 devices restores on 1 or on 4 (tests/learner/test_learner_checkpoint.py).

Saves are asynchronous by default: `save` returns once the arrays are copied off the step's buffers and a
background thread commits the files; `wait()` blocks until the last save is durable. Keep-N deletes older
steps. Every process of a multi-host learner must call `save` / `restore` (Orbax coordinates the writes).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh

from learner import sharding
from learner.config import OptimizerConfig, PPOConfig
from learner.train_step import TrainState, create_train_state


@dataclasses.dataclass
class LearnerMeta:
    """The non-array part of the learner's state."""

    update: int = 0
    """PPO updates (or SFT / value steps) completed in the current stage."""
    policy_version: int = 0
    """Version of the newest published weights."""
    stage: str = "multi_turn_ppo"
    """Current training stage (learner.config.STAGES)."""
    data_position: dict = dataclasses.field(default_factory=dict)
    """Where the data stream stands (e.g. {"spool_offset": 1234, "consumed": 987}); opaque here."""
    rng_key: Optional[list] = None
    """Raw data of the learner's PRNG key (jax.random.key_data)."""
    extra: dict = dataclasses.field(default_factory=dict)
    """Anything else JSON-able (resolved config, counters)."""

    def key(self) -> jax.Array | None:
        """The PRNG key, or None."""
        if self.rng_key is None:
            return None
        return jax.random.wrap_key_data(np.asarray(self.rng_key, dtype=np.uint32))

    @staticmethod
    def key_data(key: jax.Array) -> list:
        return np.asarray(jax.random.key_data(key)).tolist()


class LearnerCheckpointer:
    """CheckpointManager for the learner's items (see module docstring).

    Args:
      directory: folder of the checkpoints (created).
      max_to_keep: keep the newest N steps.
      async_save: commit in a background thread.
    """

    def __init__(self, directory: str | Path, max_to_keep: int = 3, async_save: bool = True):
        self.directory = Path(directory).absolute()
        self._mgr = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                enable_async_checkpointing=async_save,
                create=True,
            ),
        )
        self.last_save_blocking_s = 0.0

    def save(
        self,
        step: int,
        *,
        policy: TrainState,
        meta: LearnerMeta,
        critic: TrainState | None = None,
        reference: Any = None,
        force: bool = False,
    ) -> bool:
        """Save at `step` (monotonic across the run). Returns False when the step is already saved (the state
        of one step does not change, so the earlier save stands) or Orbax's save policy skipped it.

        The time the caller was blocked is kept in `last_save_blocking_s`.
        """
        t0 = time.perf_counter()
        if step in self._mgr.all_steps():
            return False
        items: dict[str, Any] = {
            "policy": ocp.args.StandardSave(policy),
            "meta": ocp.args.JsonSave(dataclasses.asdict(meta)),
        }
        if critic is not None:
            items["critic"] = ocp.args.StandardSave(critic)
        if reference is not None:
            items["reference"] = ocp.args.StandardSave(reference)
        try:
            saved = self._mgr.save(step, args=ocp.args.Composite(**items), force=force)
        except ocp.checkpoint_manager.StepAlreadyExistsError:
            saved = False
        self.last_save_blocking_s = time.perf_counter() - t0
        return saved

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mgr.all_steps())

    def items_at(self, step: int) -> set[str]:
        """Names of the items stored at `step`."""
        return {p.name for p in (self.directory / str(step)).iterdir() if p.is_dir()}

    def restore(
        self,
        step: int | None = None,
        *,
        policy: TrainState,
        critic: TrainState | None = None,
        reference: Any = None,
    ) -> tuple[TrainState, TrainState | None, Any, LearnerMeta]:
        """Restore the items onto the given targets (concrete or abstract; their shardings decide placement).

        Args:
          step: the step to restore; None = the newest.
          policy, critic, reference: targets; None = do not restore that item.
        Returns (policy, critic, reference, meta) with the static fields of the targets.
        Raises FileNotFoundError when there is no checkpoint or a requested item is not in it.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        present = self.items_at(step)
        want: dict[str, Any] = {"policy": policy, "critic": critic, "reference": reference}
        items: dict[str, Any] = {"meta": ocp.args.JsonRestore()}
        for name, target in want.items():
            if target is None:
                continue
            if name not in present:
                raise FileNotFoundError(f"checkpoint {self.directory}/{step} has no {name!r} item (has {sorted(present)})")
            items[name] = ocp.args.StandardRestore(_as_abstract(target))
        out = self._mgr.restore(step, args=ocp.args.Composite(**items))
        meta = LearnerMeta(**out["meta"])
        get = lambda name: out[name] if name in items else None  # noqa: E731
        return get("policy"), get("critic"), get("reference"), meta

    def wait(self) -> None:
        """Block until every pending save is committed."""
        self._mgr.wait_until_finished()

    def close(self) -> None:
        self._mgr.wait_until_finished()
        self._mgr.close()


def _as_abstract(tree: Any) -> Any:
    """Concrete arrays become ShapeDtypeStructs with their current sharding; abstract ones pass through."""

    def one(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)

    return jax.tree.map(one, tree)


def restore_target(
    make_model: Callable[[], nnx.Module],
    optim: OptimizerConfig,
    ppo_cfg: PPOConfig | None,
    mesh: Mesh,
    rules=sharding.DEFAULT_RULES,
) -> TrainState:
    """An abstract TrainState (no memory allocated) laid out on `mesh` by `rules`: the restore target that
    moves a checkpoint onto other hardware. The static fields (graph, optimiser, schedule) are real."""

    def build():
        with nnx.use_eager_sharding(False):
            return create_train_state(make_model(), optim, ppo_cfg)

    abstract = jax.eval_shape(build)
    return sharding.abstract_with_shardings(abstract, mesh, rules)
