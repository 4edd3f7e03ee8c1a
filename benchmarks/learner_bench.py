"""Learner benchmark (issue 8): does PPO learn (3 seeds), PPO update throughput / MFU / memory, and weight
publication to 4 actor processes.

    python benchmarks/learner_bench.py --out OUT [--sections learns,update,publish] [--smoke]

Sections
  learns   PPO on the synthetic two-turn task (learner.synthetic.run_ppo) for seeds 0, 1, 2: initial reward,
           updates until the mean reward is half-way to the maximum, final reward. CPU is enough.
  update   one PPO update (learner.train_step.ppo_update) on a 0.5B-class model (Qwen2.5-0.5B shape, fp32
           parameters, bf16 compute, remat, cuDNN attention on a GPU) at sequence 8192: 16 rows, minibatch 8,
           microbatch 1 (8 accumulated; `--variants mb2:remat,mb1:noremat,mb2:save_dots,...` measures other
           microbatch / remat settings one after another in the same run), 1 epoch; the critic is the same backbone with a value head. Combined
           tokens/s, model TFLOP/s, MFU, peak device memory. Model FLOPs per token of one update: proximal
           logprobs forward (2P + 2A) + critic values forward (2Pc + 2A) + policy train (6P + 6A) + critic
           train (6Pc + 6A), where P (Pc) are the matmul parameters of the policy (critic; no vocabulary
           head) and A = layers x seq x heads x head_dim (causal attention); rematerialised recompute is not
           counted. First call (compile) reported apart.
  breakdown the update's parts timed one by one with the first --variants setting: critic values and proximal
           logprobs (forward, all rows), one minibatch's policy and critic train steps; TFLOP/s and MFU each
           (benchmarks.learner_bench.bench_breakdown).
  xaccel_save / xaccel_restore   across accelerators: `xaccel_save` (on the GPU) trains a tiny policy and
           critic for 2 PPO updates on the synthetic task, writes an Orbax checkpoint plus the parameters
           (npz) and the metrics of update 3 to OUT/xaccel; `xaccel_restore --from DIR` (on another machine,
           e.g. this CPU box) restores that folder, checks the parameters bit for bit, runs update 3 and
           compares its metrics, then keeps training for 5 more updates.
  publish  weights of the same model published after an "update" to 4 actor processes on this host
           (learner.publish.AsyncWeightPublisher -> protocol WeightsPublisher -> WeightsFetcher): per version,
           the time the training loop was blocked and the time from the end of the update until all 4 actors
           hold the version (wall clocks of one host).

`--smoke` runs the same code paths with tiny shapes (CPU, a minute or two). Results: OUT/learner_bench.json
and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DATASHEET_TFLOPS = 989.0  # H200 dense bf16
MEASURED_TFLOPS = 790.0   # 8192^3 bf16 matmul measured on the H200 (see the model section of RESULTS.md)

SHAPE_05B = dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                 intermediate_size=4864, tie_embeddings=True)
SHAPE_SMOKE = dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                   intermediate_size=128, tie_embeddings=True)


def matmul_params(s: dict, head: bool = True) -> int:
    d, f, h, k, dh, v, L = (s["hidden_size"], s["intermediate_size"], s["num_heads"], s["num_kv_heads"],
                            s["head_dim"], s["vocab_size"], s["num_layers"])
    return L * (2 * d * h * dh + 2 * d * k * dh + 3 * d * f) + (v * d if head else d)


def update_flops_per_token(s: dict, seq: int) -> float:
    p, pc = matmul_params(s, True), matmul_params(s, False)
    a = s["num_layers"] * seq * s["num_heads"] * s["head_dim"]
    return (2 * p + 2 * a) + (2 * pc + 2 * a) + (6 * p + 6 * a) + (6 * pc + 6 * a)


# ------------------------------------------------------------------------------------------------ learns


def bench_learns(smoke: bool) -> dict:
    from learner.synthetic import run_ppo

    out = []
    for seed in (0, 1, 2):
        r = run_ppo(seed, updates=20 if smoke else 60, episodes=64, stop_at_half=False)
        r.pop("history")
        out.append(r)
        print(f"learns seed {seed}: {r}", flush=True)
    return {"runs": out}


# ------------------------------------------------------------------------------------------------ update


def _models(shape: dict, gpu: bool, seed: int = 0, remat: bool = True, remat_policy: str = "full",
            attention_max_segments: int = 64):
    import jax
    from flax import nnx

    from learner.model import Critic, ModelConfig, Transformer

    cfg = ModelConfig(**shape, param_dtype="float32", dtype="bfloat16" if gpu else "float32",
                      attention_impl="cudnn" if gpu else "xla", remat=remat, remat_policy=remat_policy,
                      max_position_embeddings=32768, attention_max_segments=attention_max_segments)
    # parameters made on the device by a jitted init (no host round trip)
    abstract = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(seed)))
    graphdef, _ = nnx.split(abstract)
    state = jax.jit(lambda: nnx.split(Transformer(cfg, nnx.Rngs(seed)))[1])()
    policy = nnx.merge(graphdef, state)
    return cfg, policy, Critic.from_policy(policy)


def _rollout(n_rows: int, seq: int, vocab: int, seed: int = 0):
    import jax.numpy as jnp
    import numpy as np

    from learner.train_step import RolloutBatch, SequenceBatch

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (n_rows, seq)).astype(np.int32)
    mask = np.zeros((n_rows, seq), np.float32)
    span = max(8, seq // 32)
    for b in range(n_rows):  # multi-turn layout: alternating observation / assistant spans of ~seq/32 tokens
        t = span // 2
        mask[b, t: t + span] = 1  # at least one assistant span
        while t < seq:
            n = int(rng.integers(span // 4, 2 * span))
            if rng.random() < 0.5:
                mask[b, t: t + n] = 1
            t += n
    rewards = np.zeros((n_rows, seq), np.float32)
    for b in range(n_rows):
        rewards[b, np.nonzero(mask[b])[0][-1]] = float(rng.integers(-1, 4))
    pos = np.broadcast_to(np.arange(seq, dtype=np.int32), (n_rows, seq)).copy()
    seg = np.ones((n_rows, seq), np.int32)
    behav = np.where(mask > 0, -rng.random((n_rows, seq)) * 3, 0).astype(np.float32)
    seq_b = SequenceBatch(*(jnp.asarray(x) for x in (tokens, pos, seg, mask)))
    return RolloutBatch(seq_b, jnp.asarray(behav), jnp.asarray(rewards))


REMAT_VARIANTS = {"remat": (True, "full"), "noremat": (False, "full"), "save_dots": (True, "save_dots")}


def parse_variants(text: str) -> list[tuple[int, str]]:
    """'mb1:remat,mb2:save_dots:mask' -> [(1, "remat"), (2, "save_dots:mask")]: microbatch rows and
    rematerialisation per variant (remat: recompute each layer; save_dots: recompute it but keep its projection
    matmuls' outputs, `ModelConfig.remat_policy`; noremat: keep everything). A third part `mask` sends the
    rows' segment ids through cuDNN's dense mask (`ModelConfig.attention_max_segments=0`) instead of its
    packed layout.

    Raises:
      ValueError: a variant that is not mbN:<one of REMAT_VARIANTS>[:mask] (N >= 1).
    """
    out = []
    for v in (x.strip() for x in text.split(",") if x.strip()):
        mb, _, rest = v.partition(":")
        rm, _, attn = rest.partition(":")
        if not (mb.startswith("mb") and mb[2:].isdigit() and int(mb[2:]) >= 1 and rm in REMAT_VARIANTS
                and attn in ("", "mask")):
            raise ValueError(f"--variants: {v!r} is not mbN:{'|'.join(REMAT_VARIANTS)}[:mask] (N >= 1)")
        out.append((int(mb[2:]), rest))
    if not out:
        raise ValueError("--variants: no variant given")
    return out


def bench_update_variants(smoke: bool, reps: int, variants: list[tuple[int, str]]) -> list[dict]:
    """bench_update per (microbatch, remat) variant, in one run; a variant that fails (e.g. device memory
    exhausted) is recorded with its error and the next one runs."""
    out = []
    for micro, remat in variants:
        try:
            out.append(bench_update(smoke, reps, micro, remat))
        except Exception as e:  # noqa: BLE001 - XLA raises its own error types (RESOURCE_EXHAUSTED)
            r = {"microbatch": micro, "remat": remat, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"update: {json.dumps(r)}", flush=True)
            out.append(r)
    return out


def _update_setup(smoke: bool, micro: int, remat: str) -> dict:
    """The update section's shapes, mesh, actor and critic train states and rollout (see the module doc)."""
    import jax

    from learner import sharding
    from learner.config import MeshConfig, OptimizerConfig, PPOConfig
    from learner.train_step import create_train_state

    gpu = jax.devices()[0].platform == "gpu"
    shape = SHAPE_SMOKE if smoke else SHAPE_05B
    seq = 256 if smoke else 8192
    rows, mb = (4, 2) if smoke else (16, 8)
    mesh = sharding.make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))
    ppo = PPOConfig(minibatch_size=mb, microbatch_size=micro, epochs=1, logits_chunk_size=64 if smoke else 1024)
    opt = OptimizerConfig(lr=1e-6, warmup_steps=0)
    remat, _, attn = remat.partition(":")
    on, policy_name = REMAT_VARIANTS[remat]
    _, policy_model, critic_model = _models(shape, gpu, remat=on, remat_policy=policy_name,
                                            attention_max_segments=0 if attn == "mask" else 64)
    policy = create_train_state(policy_model, opt, ppo, mesh)
    critic = create_train_state(critic_model, opt, ppo, mesh)
    del policy_model, critic_model
    rollout = sharding.shard_batch(_rollout(rows, seq, shape["vocab_size"]), mesh)
    return {"shape": shape, "seq": seq, "rows": rows, "mb": mb, "mesh": mesh, "policy": policy, "critic": critic,
            "rollout": rollout}


def bench_update(smoke: bool, reps: int, micro: int = 1, remat: str = "remat") -> dict:
    import jax

    from learner.train_step import ppo_update

    u = _update_setup(smoke, micro, remat)
    shape, seq, rows, mb, mesh = u["shape"], u["seq"], u["rows"], u["mb"], u["mesh"]
    policy, critic, rollout = u["policy"], u["critic"], u["rollout"]
    del u
    key = jax.random.key(0)
    t = time.perf_counter()
    policy, critic, m = ppo_update(policy, critic, rollout, key, mesh=mesh)
    first = time.perf_counter() - t
    times = []
    for i in range(reps):
        t = time.perf_counter()
        policy, critic, m = ppo_update(policy, critic, rollout, jax.random.key(i + 1), mesh=mesh)
        times.append(time.perf_counter() - t)
    dt = min(times)
    tokens = rows * seq
    flops = update_flops_per_token(shape, seq) * tokens
    stats = jax.devices()[0].memory_stats() or {}
    res = {
        "device": str(jax.devices()[0].device_kind), "platform": jax.devices()[0].platform, "rows": rows, "seq": seq,
        "minibatch": mb, "microbatch": micro, "remat": remat, "update_s": dt, "update_s_all": times, "first_call_s": first,
        "tokens_per_s": tokens / dt, "tflops": flops / dt / 1e12,
        "mfu_datasheet": flops / dt / 1e12 / DATASHEET_TFLOPS, "mfu_measured_ceiling": flops / dt / 1e12 / MEASURED_TFLOPS,
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
        "policy_loss": m["ppo/policy_loss"], "value_loss": m["critic/value_loss"],
    }
    print(f"update: {json.dumps(res)}", flush=True)
    return res


def bench_breakdown(smoke: bool, reps: int, micro: int = 1, remat: str = "remat") -> dict:
    """The update's parts timed one by one (each jitted step alone, after its first call; best of `reps`), with
    the FLOPs the update section counts for it: critic values and proximal logprobs over all rows (forward only:
    2 x params + 2 x attention per token), then one minibatch's policy and critic train steps (6x). The policy's
    parts carry the output head over the whole vocabulary (log-softmax and entropy included) that the critic's
    lack, so their difference is what the head costs."""
    import jax
    import jax.numpy as jnp

    from learner import sharding
    from learner.train_step import (CriticBatch, PolicyBatch, _micro, _take_rows, compute_advantages,
                                    critic_train_step, critic_values, policy_logprobs, policy_train_step)

    u = _update_setup(smoke, micro, remat)
    shape, seq, rows, mb, mesh = u["shape"], u["seq"], u["rows"], u["mb"], u["mesh"]
    policy, critic, rollout = u["policy"], u["critic"], u["rollout"]
    del u

    def to_micro(tree):
        return sharding.shard_batch(jax.tree.map(lambda x: _micro(x, micro), tree), mesh, row_axis=1)

    seq_m = to_micro(rollout.seq)
    values = critic_values(critic, seq_m).reshape(rollout.seq.tokens.shape)
    prox = policy_logprobs(policy, seq_m)[0].reshape(rollout.seq.tokens.shape)
    _, adv, ret = compute_advantages(rollout, values, policy.ppo)
    pb, cb = _take_rows((PolicyBatch(rollout.seq, rollout.behaviour_logprobs, prox, adv, None),
                         CriticBatch(rollout.seq, ret, values)), jnp.arange(mb))
    pb, cb = to_micro(pb), to_micro(cb)
    p, pc = matmul_params(shape, True), matmul_params(shape, False)
    a = shape["num_layers"] * seq * shape["num_heads"] * shape["head_dim"]
    parts = [("critic values (forward)", lambda: critic_values(critic, seq_m), (2 * pc + 2 * a) * rows * seq),
             ("proximal logprobs (forward)", lambda: policy_logprobs(policy, seq_m), (2 * p + 2 * a) * rows * seq),
             ("policy train step (1 minibatch)", lambda: policy_train_step(policy, pb), (6 * p + 6 * a) * mb * seq),
             ("critic train step (1 minibatch)", lambda: critic_train_step(critic, cb), (6 * pc + 6 * a) * mb * seq)]
    out = []
    for name, fn, flops in parts:
        t = time.perf_counter()
        jax.block_until_ready(fn())
        first = time.perf_counter() - t
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            jax.block_until_ready(fn())
            times.append(time.perf_counter() - t)
        dt = min(times)
        r = {"part": name, "microbatch": micro, "remat": remat, "s": dt, "s_all": times, "first_call_s": first,
             "tflops": flops / dt / 1e12, "mfu_datasheet": flops / dt / 1e12 / DATASHEET_TFLOPS}
        print(f"breakdown: {json.dumps(r)}", flush=True)
        out.append(r)
    return {"device": str(jax.devices()[0].device_kind), "rows": rows, "minibatch": mb, "seq": seq, "parts": out}


# ------------------------------------------------------------------------------------------------ publish


def actor_main(endpoint: str, last_version: int) -> None:
    """Actor process of the publish section: fetch every new version, print (version, unix time) per receipt."""
    from protocol.weights_channel import WeightsFetcher

    known = -1
    with WeightsFetcher(endpoint, actor_id=f"bench-{os.getpid()}", credit=8, timeout_s=60) as f:
        print(json.dumps({"ready": time.time()}), flush=True)
        while known < last_version:
            upd = f.fetch(known_version=known, timeout_s=120)
            if upd is None or upd.version <= known:
                time.sleep(0.002)
                continue
            known = upd.version
            print(json.dumps({"version": known, "t": time.time(), "bytes": int(upd.manifest.total_bytes)}), flush=True)
            if hasattr(f, "recycle"):
                f.recycle(upd)


def bench_publish(smoke: bool, versions: int, dtype: str | None, io_threads: int = 4) -> dict:
    import jax
    import jax.numpy as jnp

    from learner.publish import AsyncWeightPublisher, param_tensors
    from protocol.weights_channel import WeightsPublisher

    gpu = jax.devices()[0].platform == "gpu"
    shape = SHAPE_SMOKE if smoke else SHAPE_05B
    _, policy_model, _ = _models(shape, gpu)
    from flax import nnx

    params = nnx.state(policy_model, nnx.Param)
    pub = WeightsPublisher("tcp://127.0.0.1:*", publisher_id="bench", io_threads=io_threads).start()
    apub = AsyncWeightPublisher(pub, dtype=dtype)
    apub.submit(0, params)
    apub.wait()
    actors = [subprocess.Popen([sys.executable, __file__, "--actor", pub.endpoint, "--last-version", str(versions)],
                               stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(4)]
    got: list[dict[int, float]] = [dict() for _ in actors]

    def drain_until(pred, timeout_s=600.0):
        import selectors

        sel = selectors.DefaultSelector()
        for i, a in enumerate(actors):
            sel.register(a.stdout, selectors.EVENT_READ, i)
        t0 = time.monotonic()
        while not pred():
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError("actors did not receive the weights in time")
            for key, _ in sel.select(timeout=0.5):
                line = key.fileobj.readline()
                if line:
                    rec = json.loads(line)
                    if "version" in rec:
                        got[key.data][rec["version"]] = rec["t"]
        sel.close()

    drain_until(lambda: all(0 in g for g in got))
    bump = jax.jit(lambda p: jax.tree.map(lambda x: x + jnp.asarray(1e-6, x.dtype), p))
    rows = []
    for v in range(1, versions + 1):
        params = bump(params)  # "the update": new parameter buffers on the device
        jax.block_until_ready(params)
        t_end = time.time()
        blocked = apub.submit(v, params)
        drain_until(lambda: all(v in g for g in got))
        arrive = [g[v] for g in got]
        rows.append({"version": v, "blocked_s": blocked, "all_actors_s": max(arrive) - t_end,
                     "first_actor_s": min(arrive) - t_end, "d2h_s": apub.stats["d2h_s"],
                     "publish_s": apub.stats["publish_s"]})
        print(f"publish v{v}: {json.dumps(rows[-1])}", flush=True)
        time.sleep(0.5)
    for a in actors:
        a.wait(timeout=60)
    apub.close()
    pub.close()
    total_bytes = sum(int(x.size) * (2 if dtype == "bfloat16" else x.dtype.itemsize)
                      for x in param_tensors(params).values())
    return {"versions": rows, "bytes": total_bytes, "dtype": dtype or "float32", "actors": 4,
            "io_threads": io_threads}


# ------------------------------------------------------------------------------------------------ xaccel

XACCEL_PPO = dict(minibatch_size=32, microbatch_size=32, epochs=2, gamma=1.0, lam=1.0, logits_chunk_size=0)


def _xaccel_states(seed: int = 0):
    from flax import nnx

    from learner.config import OptimizerConfig, PPOConfig
    from learner.model import Critic, ModelConfig, Transformer
    from learner.train_step import create_train_state

    mc = ModelConfig.tiny(vocab_size=32, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                          intermediate_size=64, max_position_embeddings=512)
    opt = OptimizerConfig(lr=3e-3, warmup_steps=0)
    ppo = PPOConfig(**XACCEL_PPO)
    return (lambda: Transformer(mc, nnx.Rngs(seed)), lambda: Critic(mc, nnx.Rngs(seed + 100)), opt, ppo,
            create_train_state(Transformer(mc, nnx.Rngs(seed)), opt, ppo),
            create_train_state(Critic(mc, nnx.Rngs(seed + 100)), opt, ppo))


def _flat(tree) -> dict:
    import jax
    import numpy as np

    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def bench_xaccel_save(out: Path) -> dict:
    import jax
    import numpy as np

    from learner import synthetic
    from learner.checkpoint import LearnerCheckpointer, LearnerMeta
    from learner.train_step import ppo_update

    d = out / "xaccel"
    _, _, _, _, policy, critic = _xaccel_states()
    key = jax.random.key(0)
    for _ in range(2):
        key, k1, k2 = jax.random.split(key, 3)
        rollout, _ = synthetic.sample_rollout(policy, k1, 64)
        policy, critic, _ = ppo_update(policy, critic, rollout, k2)
    ck = LearnerCheckpointer(d / "ckpt")
    ck.save(2, policy=policy, critic=critic, meta=LearnerMeta(update=2, policy_version=2, rng_key=LearnerMeta.key_data(key)))
    ck.close()
    np.savez(d / "params.npz", **_flat({"p": policy.params, "c": critic.params, "o": policy.opt_state}))
    key, k1, k2 = jax.random.split(key, 3)
    rollout, _ = synthetic.sample_rollout(policy, k1, 64)
    np.savez(d / "rollout3.npz", **_flat(rollout))
    _, _, m = ppo_update(policy, critic, rollout, k2)
    res = {"device": str(jax.devices()[0].device_kind), "metrics_update3": m}
    (d / "saved.json").write_text(json.dumps(res))
    return res


def bench_xaccel_restore(src: Path) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from learner import sharding, synthetic
    from learner.checkpoint import LearnerCheckpointer, restore_target
    from learner.config import MeshConfig
    from learner.train_step import RolloutBatch, SequenceBatch, ppo_update

    d = src / "xaccel" if (src / "xaccel").is_dir() else src
    saved = json.loads((d / "saved.json").read_text())
    make_p, make_c, opt, ppo, _, _ = _xaccel_states()
    mesh = sharding.make_mesh(MeshConfig())
    policy, critic, _, meta = LearnerCheckpointer(d / "ckpt").restore(
        policy=restore_target(make_p, opt, ppo, mesh), critic=restore_target(make_c, opt, ppo, mesh))
    want = np.load(d / "params.npz")
    got = _flat({"p": policy.params, "c": critic.params, "o": policy.opt_state})
    bit_exact = all(np.array_equal(want[k], got[k]) for k in want.files) and set(want.files) == set(got)
    r = np.load(d / "rollout3.npz")
    arr = {k: jnp.asarray(v) for k, v in r.items()}
    seq = SequenceBatch(*(arr[f".seq.{f}"] for f in ("tokens", "positions", "segment_ids", "loss_mask")))
    rollout = RolloutBatch(seq, arr[".behaviour_logprobs"], arr[".rewards"])
    key, k1, k2 = jax.random.split(meta.key(), 3)
    policy, critic, m = ppo_update(policy, critic, rollout, k2)
    cmp = {k: (saved["metrics_update3"][k], m[k]) for k in ("ppo/policy_loss", "critic/value_loss", "ppo/grad_norm",
                                                              "ppo/entropy", "ppo/approx_kl")}
    rewards = []
    for _ in range(5):
        key, k1, k2 = jax.random.split(key, 3)
        rollout, reward = synthetic.sample_rollout(policy, k1, 64)
        rewards.append(float(np.mean(reward)))
        policy, critic, _ = ppo_update(policy, critic, rollout, k2)
    res = {"saved_on": saved["device"], "restored_on": str(jax.devices()[0].device_kind), "params_bit_exact": bit_exact,
           "update3_saved_vs_restored": cmp, "rewards_after": rewards, "meta_update": meta.update}
    print(f"xaccel: {json.dumps(res)}", flush=True)
    return res


# ------------------------------------------------------------------------------------------------ main


def table(res: dict) -> str:
    lines = []
    if "learns" in res:
        lines += ["| seed | initial reward | final reward | updates to half-way | wall s |", "| --- | --- | --- | --- | --- |"]
        for r in res["learns"]["runs"]:
            lines.append(f"| {r['seed']} | {r['initial']:.3f} | {r['final']:.3f} | {r['updates_to_half']} | {r['wall_s']:.1f} |")
        lines.append("")
    if "update" in res:
        lines += ["| update | microbatch | remat | tokens/s | TFLOP/s | MFU vs 989 | MFU vs 790 | update s | first call s "
                  "| peak GiB |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for u in res["update"]:
            if "error" in u:
                lines.append(f"| - | {u['microbatch']} | {u['remat']} | {u['error'][:80]} | | | | | | |")
                continue
            peak = u["peak_bytes_in_use"]
            lines.append(f"| {u['rows']} x {u['seq']} ({u['device']}) | {u['microbatch']} | {u['remat']} | "
                         f"{u['tokens_per_s']:,.0f} | {u['tflops']:.2f} | {100 * u['mfu_datasheet']:.1f}% | "
                         f"{100 * u['mfu_measured_ceiling']:.1f}% | {u['update_s']:.3f} | {u['first_call_s']:.1f} | "
                         f"{peak / 2**30 if peak else float('nan'):.2f} |")
        lines.append("")
    if "breakdown" in res:
        b = res["breakdown"]
        lines += [f"breakdown: {b['rows']} rows x {b['seq']} ({b['device']}), minibatch {b['minibatch']}",
                  "| part | microbatch | remat | s | TFLOP/s | MFU vs 989 | first call s |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in b["parts"]:
            lines.append(f"| {r['part']} | {r['microbatch']} | {r['remat']} | {r['s']:.3f} | {r['tflops']:.1f} | "
                         f"{100 * r['mfu_datasheet']:.1f}% | {r['first_call_s']:.1f} |")
        lines.append("")
    for p in res.get("publish", []):
        lines += [f"publish: {p['bytes'] / 2**20:.1f} MiB ({p['dtype']}) to {p['actors']} actor processes, "
                  f"{p['io_threads']} ZeroMQ I/O threads",
                  "| version | loop blocked s | all actors hold it s | first actor s | d2h s | publish s |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in p["versions"]:
            lines.append(f"| {r['version']} | {r['blocked_s']:.4f} | {r['all_actors_s']:.3f} | {r['first_actor_s']:.3f} | "
                         f"{r['d2h_s']:.3f} | {r['publish_s']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--sections", default="learns,update,publish")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes: the same code paths on CPU")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default="mb1:remat",
                    help="update section: comma-separated mbN:remat / mbN:noremat / mbN:save_dots (microbatch "
                         "rows, rematerialisation), measured one after another in this run; the breakdown "
                         "section uses the first")
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--publish-dtype", default="bfloat16")
    ap.add_argument("--io-threads", default="4", help="publish section: comma-separated ZeroMQ I/O thread counts of "
                    "the publisher, measured one after another in this run (e.g. 1,4)")
    ap.add_argument("--from", dest="src", default=None, help="xaccel_restore: the OUT folder of an xaccel_save run")
    ap.add_argument("--actor", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--last-version", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.actor:
        actor_main(args.actor, args.last_version)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"argv": sys.argv, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    sections = [s for s in args.sections.split(",") if s]
    if "learns" in sections:
        res["learns"] = bench_learns(args.smoke)
    if "update" in sections:
        res["update"] = bench_update_variants(args.smoke, args.reps, parse_variants(args.variants))
    if "breakdown" in sections:
        micro, remat = parse_variants(args.variants)[0]
        res["breakdown"] = bench_breakdown(args.smoke, args.reps, micro, remat)
    if "publish" in sections:
        res["publish"] = [bench_publish(args.smoke, args.versions, args.publish_dtype or None, int(n))
                          for n in args.io_threads.split(",") if n]
    if "xaccel_save" in sections:
        res["xaccel_save"] = bench_xaccel_save(out)
    if "xaccel_restore" in sections:
        res["xaccel_restore"] = bench_xaccel_restore(Path(args.src or out))
    (out / "learner_bench.json").write_text(json.dumps(res, indent=2))
    print(table(res))


if __name__ == "__main__":
    main()
