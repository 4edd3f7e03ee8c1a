"""The learner service over real ZeroMQ sockets on loopback: actors' trajectories in (acked, spooled), PPO
updates, weights out (pinned-host copy, background publication, the actors' tensor naming), checkpoints, and a
restart that trains every acknowledged trajectory exactly once."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _tiny_models import TINY, make_critic, make_policy  # noqa: E402

from learner import synthetic  # noqa: E402
from learner.config import CheckpointConfig, LearnerConfig, MeshConfig, OptimizerConfig, PPOConfig, ServiceConfig  # noqa: E402
from learner.metrics import read_jsonl  # noqa: E402
from learner.publish import param_tensors  # noqa: E402
from learner.service import LearnerService  # noqa: E402
from protocol.trajectory_channel import TrajectoryOutbox  # noqa: E402
from protocol.weights_channel import WeightsFetcher  # noqa: E402

CFG = LearnerConfig(
    ppo=PPOConfig(minibatch_size=4, microbatch_size=4, logits_chunk_size=0, max_policy_lag=8),
    policy_optim=OptimizerConfig(lr=1e-2, warmup_steps=0),
    critic_optim=OptimizerConfig(lr=1e-2, warmup_steps=0),
    mesh=MeshConfig(),
    checkpoint=CheckpointConfig(every_updates=1, max_to_keep=2),
    max_seq_len=synthetic.LENGTH * 2,
    batch_trajectories=8,
    buffer_capacity=8,
)


def _svc(**kw) -> ServiceConfig:
    return ServiceConfig(trajectories="tcp://127.0.0.1:*", weights="tcp://127.0.0.1:*", read_timeout_s=0.05, **kw)


def _episodes(policy_state, n, version, prefix, seed):
    rollout, reward = synthetic.sample_rollout(policy_state, jax.random.key(seed), n)
    return synthetic.to_trajectories(rollout, reward, policy_version=version, prefix=prefix)


def _wait(cond, timeout_s=120.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, "timed out"
        time.sleep(0.05)


def test_service_trains_publishes_checkpoints_and_resumes_without_loss(tmp_path):
    trained: list[str] = []
    on_update = lambda svc, trajs, m: trained.extend(t.episode_id for t in trajs)  # noqa: E731

    svc = LearnerService(CFG, _svc(max_updates=2), tmp_path, make_policy(), make_critic(), on_update=on_update)
    svc.start()
    # the actors' view of version 0: same tensor names and values as the learner's parameters
    with WeightsFetcher(svc.weights.endpoint, actor_id="t") as fetcher:
        update = fetcher.fetch(timeout_s=60)
        assert update is not None and update.version == 0
        mine = {k: np.asarray(v) for k, v in param_tensors(svc.policy.params).items()}
        assert set(update.tensors) == set(mine)
        for k, v in mine.items():
            np.testing.assert_array_equal(update.tensors[k], v)
        from actors.weights import model_from_tensors  # the actors' loader accepts the naming

        model_from_tensors(TINY, update.tensors)

    eps = _episodes(svc.policy, 20, 0, "a", seed=1)
    stop = threading.Event()
    status = {}
    th = threading.Thread(target=lambda: status.setdefault("run", svc.run(stop)))
    th.start()
    with TrajectoryOutbox(svc.receiver.endpoint, actor_id="actor-1", resend_after_s=0.5) as out:
        for t in eps:
            out.put(t)
        assert out.flush(timeout_s=120)  # all acked: durable in the spool
    th.join(timeout=300)
    assert status["run"] == "done" and svc.update == 2 and svc.version == 2
    assert len(trained) == 16 and len(set(trained)) == 16
    rows = read_jsonl(tmp_path / "metrics" / "metrics.jsonl")
    assert [r["learner/update"] for r in rows] == [1, 2]
    for key in ("ppo/policy_loss", "ppo/clip_frac", "ppo/approx_kl", "ppo/entropy", "critic/value_loss",
                "ppo/explained_variance", "ppo/grad_norm", "critic/grad_norm", "reward/mean",
                "learner/policy_lag_mean", "learner/tokens_per_s", "publish/blocked_s"):
        assert key in rows[-1] and rows[-1][key] is not None, key
    assert rows[-1]["learner/policy_lag_max"] == 1  # sampled with v0, trained at v1
    assert svc.publisher.stats["published"] >= 2 and svc.publisher.stats["errors"] == 0
    with WeightsFetcher(svc.weights.endpoint, actor_id="t2") as fetcher:
        assert fetcher.fetch(timeout_s=60).version == 2
    # 4 acknowledged trajectories were still waiting (in the buffer or unread in the spool) at the stop
    assert len(svc.buffer) <= 4
    svc.close()

    # restart in the same folder: resumes at update 2 / version 2 and trains the 4 waiting ones + 4 new ones
    svc2 = LearnerService(CFG, _svc(max_updates=3), tmp_path, make_policy(seed=5), make_critic(seed=6), on_update=on_update)
    assert (svc2.update, svc2.version) == (2, 2)
    for a, b in zip(jax.tree.leaves(svc2.policy.params), jax.tree.leaves(svc.policy.params)):
        np.testing.assert_array_equal(a, b)
    svc2.start()
    eps2 = _episodes(svc2.policy, 4, 2, "b", seed=2)
    with TrajectoryOutbox(svc2.receiver.endpoint, actor_id="actor-2") as out:
        for t in eps2:
            out.put(t)
        assert out.flush(timeout_s=120)
        # a resend of an already trained trajectory is acked as a duplicate and never trained again
        out.put(eps[0])
        assert out.flush(timeout_s=120)
    assert svc2.run() == "done" and svc2.update == 3
    assert sorted(trained) == sorted(t.episode_id for t in eps + eps2)  # every one, exactly once
    assert svc2.receiver.stats["duplicates"] == 1
    svc2.close()


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_async_publisher_skips_superseded_versions_and_casts(dtype):
    from learner.publish import AsyncWeightPublisher

    class SlowSink:  # stands in for a publisher whose actors are slow to drain it
        def __init__(self):
            self.got = []

        def publish(self, version, tensors):
            time.sleep(0.3)
            self.got.append((version, {k: str(v.dtype) for k, v in tensors.items()}))

    sink = SlowSink()
    pub = AsyncWeightPublisher(sink, dtype=dtype)
    params = make_policy()
    for v in range(5):
        pub.submit(v, params)
    pub.close()
    versions = [v for v, _ in sink.got]
    assert versions[-1] == 4 and versions == sorted(versions) and len(versions) < 5  # the newest always goes out
    assert pub.stats["skipped"] == 5 - len(versions)
    want = "bfloat16" if dtype == "bfloat16" else "float32"
    assert set(sink.got[-1][1].values()) == {want}


def test_service_beyond_loopback_needs_curve_and_admits_only_authorised_actors(tmp_path):
    from protocol.auth import CurveClient, init_keys

    beyond = dict(trajectories="tcp://*:*", weights="tcp://*:*", read_timeout_s=0.05)
    with pytest.raises(ValueError, match="needs CURVE keys"):  # refused before anything binds
        LearnerService(CFG, ServiceConfig(**beyond), tmp_path / "nokeys", make_policy(), make_critic())

    keys = init_keys(tmp_path / "keys", ["actor0"])
    stranger = init_keys(tmp_path / "other", ["actor0"])  # a key pair the learner never authorised
    svc = LearnerService(CFG, ServiceConfig(**beyond, curve_secret_key=keys["server_secret_key"],
                                            curve_authorized_keys=keys["authorized_keys"]),
                         tmp_path / "run", make_policy(), make_critic())
    assert svc.curve_on
    svc.start()
    try:
        def local(ep: str) -> str:
            return "tcp://127.0.0.1:" + ep.rsplit(":", 1)[1]

        good = CurveClient(keys["client_actor0_secret_key"], keys["server_public_key"])
        bad = CurveClient(stranger["client_actor0_secret_key"], keys["server_public_key"])
        with WeightsFetcher(local(svc.weights.endpoint), actor_id="good", curve=good) as f:
            assert f.fetch(timeout_s=30).version == 0
        for curve in (bad, None):  # an unknown key, and no CURVE at all: nothing comes back
            with WeightsFetcher(local(svc.weights.endpoint), actor_id="bad", curve=curve) as f:
                with pytest.raises(TimeoutError):
                    f.newest_manifest(timeout_s=2)
        eps = _episodes(svc.policy, 2, 0, "c", seed=3)
        with TrajectoryOutbox(local(svc.receiver.endpoint), actor_id="bad", curve=bad, resend_after_s=0.5) as out:
            out.put(eps[0])
            assert not out.flush(timeout_s=3)  # never acknowledged: the learner did not let it in
        with TrajectoryOutbox(local(svc.receiver.endpoint), actor_id="good", curve=good) as out:
            out.put(eps[1])
            assert out.flush(timeout_s=60)
        assert svc.receiver.stats["stored"] == 1
    finally:
        svc.close()


def test_service_refuses_unusable_trajectories_and_keeps_training(tmp_path):
    # Trajectories the learner cannot train on (here: NaN behaviour log-probs, as a NaN sampler made them) are
    # acknowledged, counted by reason and skipped; the usable ones fill the batch and the service keeps serving.
    trained: list[str] = []
    on_update = lambda svc, trajs, m: trained.extend(t.episode_id for t in trajs)  # noqa: E731
    svc = LearnerService(CFG, _svc(max_updates=1), tmp_path, make_policy(), make_critic(), on_update=on_update)
    svc.start()
    good = _episodes(svc.policy, 8, 0, "good", seed=1)
    bad = [dataclasses.replace(t, episode_id=f"bad-{i}", behaviour_logprobs=np.full_like(t.behaviour_logprobs, np.nan))
           for i, t in enumerate(_episodes(svc.policy, 3, 0, "x", seed=2))]
    with TrajectoryOutbox(svc.receiver.endpoint, actor_id="actor-1") as out:
        for t in bad[:2] + good[:4] + bad[2:] + good[4:]:
            out.put(t)
        assert out.flush(timeout_s=120)
    assert svc.run() == "done" and svc.update == 1
    assert sorted(trained) == sorted(t.episode_id for t in good)
    assert svc.counters["refused"] == 3 and svc.refused_reasons == {"bad_logprobs": 3}
    row = read_jsonl(tmp_path / "metrics" / "metrics.jsonl")[-1]
    assert row["learner/refused_total"] == 3 and row["learner/refused_bad_logprobs_total"] == 3
    svc.close()


def test_service_stops_after_updates_with_only_non_finite_gradients(tmp_path):
    # A policy whose parameters went NaN: every optimiser step is skipped (parameters kept), and after
    # MAX_NONFINITE_UPDATES such updates in a row the service raises instead of publishing the same weights forever.
    from flax import nnx

    from learner.service import MAX_NONFINITE_UPDATES

    from learner.train_step import create_train_state

    eps = _episodes(create_train_state(make_policy(), CFG.policy_optim, CFG.ppo), 8 * MAX_NONFINITE_UPDATES, 0, "n",
                    seed=4)  # sampled by a healthy policy: finite behaviour log-probs
    graphdef, state = nnx.split(make_policy())
    state = jax.tree.map(lambda x: x * np.nan if np.issubdtype(x.dtype, np.floating) else x, state)
    svc = LearnerService(CFG, _svc(max_updates=MAX_NONFINITE_UPDATES + 2), tmp_path, nnx.merge(graphdef, state),
                         make_critic())
    svc.start()
    with TrajectoryOutbox(svc.receiver.endpoint, actor_id="actor-1") as out:
        for t in eps:
            out.put(t)
        assert out.flush(timeout_s=120)
    with pytest.raises(FloatingPointError, match=f"{MAX_NONFINITE_UPDATES} updates in a row had only non-finite"):
        svc.run()
    assert svc.update == MAX_NONFINITE_UPDATES
    svc.close()
