"""Worker of the multi-host test: a learner process on CPU, alone or one of several joined by jax.distributed.

  python _multihost_worker.py OUT_DIR NUM_PROCESSES PROCESS_ID COORDINATOR   # NUM_PROCESSES > 1: distributed
  python _multihost_worker.py OUT_DIR 1 0 -                                  # single process reference

Every process sees the same global data and mesh (data=2, fsdp=2, tensor=1 over all global devices), runs two
PPO updates, saves an Orbax checkpoint (all processes write their shards), and writes its metrics to
OUT_DIR/metrics_<num_processes>_<process_id>.json. The single-process reference also restores the
multi-process checkpoint (when present) and reports the largest parameter difference to its own.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
# A hang (a collective or a checkpoint barrier one process never reaches) prints every thread's stack and exits,
# so the test fails with the place instead of waiting out its timeout.
faulthandler.dump_traceback_later(float(os.environ.get("MULTIHOST_HANG_S", "480")), exit=True)

import jax  # noqa: E402

out_dir, nproc, pid, coord = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if nproc > 1:
    jax.distributed.initialize(coordinator_address=coord, num_processes=nproc, process_id=pid,
                               initialization_timeout=120)

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from _rollouts import multiturn_rollout  # noqa: E402
from _tiny_models import TINY  # noqa: E402

from learner import sharding  # noqa: E402
from learner import train_step as ts  # noqa: E402
from learner.checkpoint import LearnerCheckpointer, LearnerMeta, restore_target  # noqa: E402
from learner.config import MeshConfig, OptimizerConfig, PPOConfig  # noqa: E402
from learner.model import Critic, Transformer  # noqa: E402

PPO = PPOConfig(minibatch_size=8, microbatch_size=4, logits_chunk_size=0)
OPT = OptimizerConfig(lr=1e-2, warmup_steps=0)


def main():
    assert jax.process_count() == nproc, (jax.process_count(), nproc)
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=1))
    policy = ts.create_train_state(sharding.init_sharded(lambda: Transformer(TINY, nnx.Rngs(0)), mesh), OPT, PPO, mesh)
    critic = ts.create_train_state(sharding.init_sharded(lambda: Critic(TINY, nnx.Rngs(1)), mesh), OPT, PPO, mesh)
    key = jax.random.key(0)
    history = []
    for u in range(2):
        seq, rewards = multiturn_rollout(16, 40, seed=u)
        behav = np.where(np.asarray(seq.loss_mask) > 0, -2.0, 0.0).astype(np.float32)  # same on every process
        rollout = ts.RolloutBatch(seq, behav, rewards)
        rollout = jax.tree.map(np.asarray, rollout)
        rollout = sharding.shard_batch(rollout, mesh)
        key, sub = jax.random.split(key)
        policy, critic, m = ts.ppo_update(policy, critic, rollout, sub, mesh=mesh)
        history.append({k: v for k, v in m.items() if k not in ("ppo/update_s", "ppo/update_tokens_per_s")})
    ck = LearnerCheckpointer(os.path.join(out_dir, f"ckpt_{nproc}"), async_save=True)
    ck.save(2, policy=policy, critic=critic, meta=LearnerMeta(update=2, policy_version=2))
    ck.close()
    report = {"process_count": jax.process_count(), "devices": jax.device_count(),
              "local_devices": jax.local_device_count(), "history": history}
    other = os.path.join(out_dir, "ckpt_2")
    if nproc == 1 and os.path.isdir(other):
        target = restore_target(lambda: Transformer(TINY, nnx.Rngs(0)), OPT, PPO, mesh)
        restored, _, _, meta = LearnerCheckpointer(other).restore(policy=target)
        diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), restored.params, policy.params)
        report["restored_max_param_diff"] = max(jax.tree.leaves(diffs))
        report["restored_meta_update"] = meta.update
    with open(os.path.join(out_dir, f"metrics_{nproc}_{pid}.json"), "w") as f:
        json.dump(report, f)
    if nproc > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
