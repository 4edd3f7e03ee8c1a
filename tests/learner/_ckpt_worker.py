"""Subprocess worker for the cross-mesh checkpoint test. Run with XLA_FLAGS=--xla_force_host_platform_device_count=N.

  python _ckpt_worker.py save    DIR DATA FSDP TENSOR   # train 1 update on the mesh, save, run update 2
  python _ckpt_worker.py restore DIR DATA FSDP TENSOR   # restore onto this mesh, run update 2

Each writes DIR/<mode>_<ndev>.json with the update-2 metrics; `save` also writes the saved parameters to
DIR/params.npz and `restore` checks the restored ones against it bit for bit.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from _rollouts import rollout_for  # noqa: E402
from _tiny_models import TINY  # noqa: E402
from flax import nnx  # noqa: E402

from learner import sharding  # noqa: E402
from learner import train_step as ts  # noqa: E402
from learner.checkpoint import LearnerCheckpointer, LearnerMeta, restore_target  # noqa: E402
from learner.config import MeshConfig, OptimizerConfig, PPOConfig  # noqa: E402
from learner.model import Critic, Transformer  # noqa: E402

CFG = TINY.replace(num_layers=2, num_heads=4, num_kv_heads=2)
PPO = PPOConfig(minibatch_size=8, microbatch_size=4, epochs=1)
OPT_P = OptimizerConfig(lr=1e-2, warmup_steps=1, decay_steps=10)
OPT_C = OptimizerConfig(lr=1e-2, warmup_steps=1, decay_steps=10)


def flat(tree):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def rollout(policy, mesh, seed):
    # rollouts are built from the *initial-seed* policy so every process sees the same data
    return sharding.shard_batch(rollout_for(policy, 16, seed=seed, noise=0.2), mesh)


def main():
    mode, d = sys.argv[1], sys.argv[2]
    data, fsdp, tensor = (int(x) for x in sys.argv[3:6])
    mesh = sharding.make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor))
    ndev = len(jax.devices())
    ckpt = LearnerCheckpointer(os.path.join(d, "ckpt"), max_to_keep=2)
    data_policy = ts.create_train_state(sharding.init_sharded(lambda: Transformer(CFG, nnx.Rngs(7)), mesh), OPT_P, PPO, mesh)
    if mode == "save":
        policy = ts.create_train_state(sharding.init_sharded(lambda: Transformer(CFG, nnx.Rngs(0)), mesh), OPT_P, PPO, mesh)
        critic = ts.create_train_state(sharding.init_sharded(lambda: Critic(CFG, nnx.Rngs(1)), mesh), OPT_C, PPO, mesh)
        key = jax.random.key(42)
        for i in range(1):
            key, sub = jax.random.split(key)
            policy, critic, _ = ts.ppo_update(policy, critic, rollout(data_policy, mesh, i), sub, mesh=mesh)
        meta = LearnerMeta(update=1, policy_version=1, stage="multi_turn_ppo", data_position={"spool_offset": 32},
                           rng_key=LearnerMeta.key_data(key))
        ckpt.save(1, policy=policy, critic=critic, meta=meta)
        ckpt.wait()
        np.savez(os.path.join(d, "params.npz"), **flat({"p": policy.params, "o": policy.opt_state, "c": critic.params}))
        spec = sharding.describe(policy.params)
    else:
        p_t = restore_target(lambda: Transformer(CFG, nnx.Rngs(0)), OPT_P, PPO, mesh)
        c_t = restore_target(lambda: Critic(CFG, nnx.Rngs(0)), OPT_C, PPO, mesh)
        policy, critic, _, meta = ckpt.restore(policy=p_t, critic=c_t)
        assert meta.update == 1 and meta.policy_version == 1 and meta.data_position == {"spool_offset": 32}
        key = meta.key()
        saved = np.load(os.path.join(d, "params.npz"))
        got = flat({"p": policy.params, "o": policy.opt_state, "c": critic.params})
        assert set(got) == set(saved.files), (sorted(got)[:3], sorted(saved.files)[:3])
        for k in saved.files:
            assert np.array_equal(saved[k], got[k]), k
        assert int(policy.step) == 2 and int(critic.step) == 2  # 1 update x 2 minibatches
        spec = sharding.describe(policy.params)
        devs = {d.id for x in jax.tree.leaves(policy.params) for d in x.sharding.device_set}
        assert len(devs) == ndev, devs
    key, sub = jax.random.split(key)
    _, _, m = ts.ppo_update(policy, critic, rollout(data_policy, mesh, 1), sub, mesh=mesh)
    with open(os.path.join(d, f"{mode}_{ndev}.json"), "w") as f:
        json.dump({"metrics": m, "spec": spec}, f)
    ckpt.close()


if __name__ == "__main__":
    main()
