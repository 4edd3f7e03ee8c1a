"""Model benchmark (H200): training-step throughput and MFU, decode throughput against the HBM roofline and
against `transformers` generate, sampler-vs-learner log-prob mismatch in bf16, and 32k-token contexts.

Usage (on the GPU machine, from the repository root):
    python benchmarks/model_bench.py --out OUTDIR [--budget-s 280] [--sections train,decode,...]

Sections (run in this order, each skipped once the time budget is spent; results are written to
OUTDIR/model_bench.json after every section and a table is printed last):
  hf        transformers `generate` (PyTorch, bf16, sdpa, default dynamic cache) in a subprocess that runs
            first and exits before JAX takes the GPU
  ceilings  bf16 8192^3 matmul rate and device-to-device copy bandwidth, measured in this run
  attn      cuDNN flash attention against the XLA reference on one small case (falls back to "xla" /
            "chunked" attention if cuDNN fails)
  train     forward + backward (loss = mean token NLL, all gradients + their global norm), fp32 parameters,
            bf16 compute, seq 4096, Qwen2.5-0.5B and -7B shapes, random weights
  decode    Sampler.generate (prompt 256, 128 new tokens, temperature 1) at batch 1 / 16 / 64 for both shapes
  mismatch  behaviour log-probs of the bf16 sampler (0.5B, batch 64) against the learner's bf16 and fp32 full
            forward on the same parameters
  long      0.5B: prefill of 8 prompts of 32704 tokens then 64 decode steps at batch 8; forward + backward of a
            32768-token sequence with remat

MFU = model FLOPs / time / peak. Model FLOPs per trained token = 6 * (matmul parameters, output head
included) + 6 * layers * seq * heads * head_dim (causal attention, forward + backward). Decode roofline:
bytes per step = all matmul weights (bf16) + the KV cache of the average context, over the measured copy
bandwidth; tokens/s at the roofline = batch / (bytes / bandwidth).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DATASHEET_TFLOPS = 989.0
MEASURED_TFLOPS = 790.0   # KINDS.md: 8192^3 bf16 matmul on random data, H200
MEASURED_HBM_TBS = 4.3    # KINDS.md: device-to-device copy, bytes read + written

SHAPES = {
    "0.5B": dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                 intermediate_size=4864, tie_embeddings=True),
    "7B": dict(vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
               intermediate_size=18944, tie_embeddings=False),
}


SMOKE_SHAPES = {  # --smoke: the same code paths on CPU in a minute
    "0.5B": dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=128, tie_embeddings=True),
    "7B": dict(vocab_size=512, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=1, head_dim=16,
               intermediate_size=96, tie_embeddings=False),
}
SIZES = dict(train_seq=4096, prompt=256, new_tokens=128, long_prompt=32704, long_new=64, long_seq=32768,
             hf_new=64, matmul_n=8192, copy_bytes=2 * 2**30, logits_chunk=4096)
SMOKE_SIZES = dict(train_seq=64, prompt=16, new_tokens=16, long_prompt=240, long_new=8, long_seq=256,
                   hf_new=4, matmul_n=256, copy_bytes=2**20, logits_chunk=64)


def matmul_params(s: dict) -> int:
    d, f, h, k, dh, v, L = (s["hidden_size"], s["intermediate_size"], s["num_heads"], s["num_kv_heads"],
                            s["head_dim"], s["vocab_size"], s["num_layers"])
    return L * (2 * d * h * dh + 2 * d * k * dh + 3 * d * f) + v * d


def train_flops_per_token(s: dict, seq: int) -> float:
    return 6.0 * matmul_params(s) + 6.0 * s["num_layers"] * seq * s["num_heads"] * s["head_dim"]


def kv_bytes_per_token(s: dict, itemsize: int = 2) -> int:
    return s["num_layers"] * 2 * s["num_kv_heads"] * s["head_dim"] * itemsize


# ------------------------------------------------------------------------------ transformers baseline


def hf_worker(spec_json: str) -> None:
    """Runs in a subprocess: transformers generate timings, printed as one JSON line."""
    import torch
    import transformers

    spec = json.loads(spec_json)
    if spec.get("smoke"):
        SHAPES.update(SMOKE_SHAPES)
    out = []

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    torch.manual_seed(0)
    for shape_name, batches in spec["runs"]:
        s = SHAPES[shape_name]
        cfg = transformers.Qwen2Config(
            vocab_size=s["vocab_size"], hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
            num_hidden_layers=s["num_layers"], num_attention_heads=s["num_heads"],
            num_key_value_heads=s["num_kv_heads"], tie_word_embeddings=s["tie_embeddings"],
            max_position_embeddings=32768, rope_theta=1e6)
        torch.set_default_dtype(torch.bfloat16)
        t0 = time.perf_counter()
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(dev):
            model = transformers.Qwen2ForCausalLM(cfg).eval()
        sync()
        init_s = time.perf_counter() - t0
        for b in batches:
            ids = torch.randint(0, s["vocab_size"], (b, spec["prompt"]), device=dev)
            kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                      top_k=0, top_p=1.0, pad_token_id=0)

            def timed(n: int) -> float:
                sync()
                t = time.perf_counter()
                with torch.no_grad():
                    model.generate(max_new_tokens=n, min_new_tokens=n, **kw)
                sync()
                return time.perf_counter() - t

            timed(2)  # warm-up
            t1 = timed(1)
            tn = timed(spec["new_tokens"])
            steps = spec["new_tokens"] - 1
            out.append({"shape": shape_name, "batch": b, "prompt": spec["prompt"], "new_tokens": spec["new_tokens"],
                        "prefill_s": t1, "decode_s": tn - t1, "decode_tok_s": b * steps / (tn - t1),
                        "init_s": init_s})
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print("HF_RESULT " + json.dumps(out), flush=True)


def run_hf(runs: list, prompt: int, new_tokens: int, timeout_s: float, smoke: bool = False) -> list:
    spec = json.dumps({"runs": runs, "prompt": prompt, "new_tokens": new_tokens, "smoke": smoke})
    proc = subprocess.run([sys.executable, __file__, "--hf-worker", spec], capture_output=True, text=True,
                          timeout=timeout_s, env=dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "")))
    for line in proc.stdout.splitlines():
        if line.startswith("HF_RESULT "):
            return json.loads(line[len("HF_RESULT "):])
    raise RuntimeError(f"transformers worker failed (rc {proc.returncode}): {proc.stderr[-3000:]}")


# ------------------------------------------------------------------------------------------- JAX parts


class Bench:
    def __init__(self, out_dir: Path, budget_s: float, attention: str | None):
        self.out_dir = out_dir
        self.deadline = time.monotonic() + budget_s
        self.results: dict = {"sections": {}, "errors": {}, "timings_s": {}}
        self.attention = attention
        self.long_attention = attention

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        (self.out_dir / "model_bench.json").write_text(json.dumps(self.results, indent=2, default=str))

    def section(self, name: str, fn, min_left_s: float = 20.0) -> None:
        if self.left() < min_left_s:
            self.results["errors"][name] = f"skipped: {self.left():.0f} s of budget left"
            print(f"== {name}: skipped (budget)", flush=True)
            self.save()
            return
        print(f"== {name} ({self.left():.0f} s left)", flush=True)
        t = time.monotonic()
        try:
            fn()
        except Exception as e:  # a failed section must not cost the others
            self.results["errors"][name] = f"{type(e).__name__}: {e}"[:2000]
            traceback.print_exc()
        self.results["timings_s"][name] = round(time.monotonic() - t, 1)
        print(f"   {name} took {time.monotonic() - t:.1f} s", flush=True)
        self.save()


def _time(fn, reps: int) -> float:
    """Median seconds of `reps` calls of fn() (fn blocks until its results are ready)."""
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


def ceilings(b: Bench) -> None:
    import jax
    import jax.numpy as jnp

    n = SIZES["matmul_n"]
    x = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    y = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    mm = jax.jit(lambda a, c: a @ c)
    mm(x, y).block_until_ready()
    t = _time(lambda: mm(x, y).block_until_ready(), 10)
    big = jax.random.normal(jax.random.key(2), (SIZES["copy_bytes"] // 4,), jnp.float32)  # 2 GiB
    cp = jax.jit(lambda a: a * 1.0001)
    cp(big).block_until_ready()
    tc = _time(lambda: cp(big).block_until_ready(), 10)
    b.results["sections"]["ceilings"] = {
        "matmul_bf16_tflops": 2 * n**3 / t / 1e12, "copy_tb_s": 2 * big.nbytes / tc / 1e12,
        "device": str(jax.devices()[0].device_kind), "jax": jax.__version__}


def attention_check(b: Bench) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from learner.model import ModelConfig, attend

    cfg = ModelConfig.tiny(num_heads=14, num_kv_heads=2, head_dim=64, hidden_size=896, dtype="bfloat16")
    q = jax.random.normal(jax.random.key(0), (2, 512, 14, 64), jnp.bfloat16)
    k = jax.random.normal(jax.random.key(1), (2, 512, 2, 64), jnp.bfloat16)
    v = jax.random.normal(jax.random.key(2), (2, 512, 2, 64), jnp.bfloat16)
    lengths = jnp.array([512, 300], jnp.int32)
    seg = jnp.concatenate([jnp.ones((2, 200), jnp.int32), 2 * jnp.ones((2, 312), jnp.int32)], axis=1)
    rec, errors = {}, {}
    for name, kwargs in (("causal", {}), ("lengths", {"lengths": lengths}), ("segments", {"segment_ids": seg})):
        seg_ids, lens = kwargs.get("segment_ids"), kwargs.get("lengths")
        try:
            ref = attend(cfg, q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), seg_ids, lens)
            got = jax.jit(lambda q, k, v: attend(cfg.replace(attention_impl="cudnn"), q, k, v, seg_ids, lens))(q, k, v)
            valid = (np.arange(512)[None] < np.asarray(lengths)[:, None]) if name == "lengths" else np.ones((2, 512), bool)
            rec[name] = float(np.abs(np.asarray(got, np.float32) - np.asarray(ref))[valid].max())
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"[:500]
    b.results["sections"]["attn"] = {"cudnn_vs_fp32_max_abs": rec, "cudnn_errors": errors}
    if "causal" in rec and "lengths" in rec and max(rec["causal"], rec["lengths"]) < 0.05:
        b.attention = b.attention or "cudnn"
        b.long_attention = b.long_attention or "cudnn"
    else:
        raise RuntimeError(f"cuDNN attention unusable: {rec} {errors}")


def _init_state(cfg):
    """Random parameters made on the device (jitted init), as (graphdef, state)."""
    import jax
    from flax import nnx

    from learner.model import Transformer

    abstract = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    state = jax.jit(lambda: nnx.split(Transformer(cfg, nnx.Rngs(0)))[1])()
    return graphdef, state


def _train_step(graphdef, chunked: int = 0):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from learner.model import chunked_token_logprobs, token_logprobs

    def loss_fn(state, tokens):
        model = nnx.merge(graphdef, state)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        pos = jnp.broadcast_to(jnp.arange(inputs.shape[1], dtype=jnp.int32)[None], inputs.shape)
        if chunked:
            lp = chunked_token_logprobs(model, model.hidden_states(inputs, pos), targets, 1.0, chunked)
        else:
            lp = token_logprobs(model(inputs, pos), targets)
        return -lp.mean()

    @jax.jit
    def step(state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(state, tokens)
        sq = sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads))
        return loss, jnp.sqrt(sq)

    return step


def train(b: Bench, shape: str, batch: int, seq: int, reps: int) -> None:
    import jax
    import numpy as np

    from learner.model import ModelConfig

    s = SHAPES[shape]
    cfg = ModelConfig(**s, param_dtype="float32", dtype="bfloat16", attention_impl=b.attention or "xla")
    graphdef, state = _init_state(cfg)
    step = _train_step(graphdef)
    tokens = jax.numpy.asarray(np.random.default_rng(0).integers(0, s["vocab_size"], (batch, seq + 1), np.int32))
    t = time.perf_counter()
    loss, norm = step(state, tokens)
    jax.block_until_ready((loss, norm))
    compile_s = time.perf_counter() - t
    dt = _time(lambda: jax.block_until_ready(step(state, tokens)), reps)
    flops = train_flops_per_token(s, seq) * batch * seq
    stats = jax.devices()[0].memory_stats() or {}
    b.results["sections"][f"train_{shape}"] = {
        "batch": batch, "seq": seq, "step_s": dt, "tokens_per_s": batch * seq / dt,
        "tflops": flops / dt / 1e12, "mfu_measured_ceiling": flops / dt / 1e12 / MEASURED_TFLOPS,
        "mfu_datasheet": flops / dt / 1e12 / DATASHEET_TFLOPS, "first_call_s": compile_s,
        "loss": float(loss), "grad_norm": float(norm), "attention": cfg.attention_impl,
        "peak_bytes_in_use": stats.get("peak_bytes_in_use")}


def _peaked_05b(b: Bench, residual_float32: bool = True):
    """The 0.5B shape in bf16 with a rescaled embedding (std 0.12, logits std ~3.6) so that the sampled
    distributions are peaked like a trained model's rather than near-uniform."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from learner.model import ModelConfig

    cfg = ModelConfig(**SHAPES["0.5B"], param_dtype="bfloat16", dtype="bfloat16",
                      attention_impl=b.attention or "xla", residual_float32=residual_float32)
    graphdef, state = _init_state(cfg)
    model = nnx.merge(graphdef, state)
    emb = model.backbone.embed[...]
    model.backbone.embed.set_value((jax.random.normal(jax.random.key(7), emb.shape, jnp.float32) * 0.12)
                                   .astype(emb.dtype))
    return model


def decode(b: Bench, shape: str, batches: list, prompt: int, new_tokens: int, model=None) -> None:
    import jax
    import numpy as np

    from actors.sampler import Sampler, SamplerConfig, SamplingParams
    from flax import nnx
    from learner.model import ModelConfig

    s = SHAPES[shape]
    if model is None:
        cfg = ModelConfig(**s, param_dtype="bfloat16", dtype="bfloat16", attention_impl=b.attention or "xla")
        model = nnx.merge(*_init_state(cfg))
    sampler = Sampler(model, SamplerConfig(decode_chunk_steps=16))
    del model
    weight_bytes = matmul_params(s) * 2
    rows = []
    for batch in batches:
        if b.left() < 15:
            break
        prompts = np.random.default_rng(batch).integers(0, s["vocab_size"], (batch, prompt)).tolist()
        sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
        t = time.perf_counter()
        sampler.generate(prompts, sp, seed=0)
        first = time.perf_counter() - t
        outs = sampler.generate(prompts, sp, seed=1)
        st = dict(sampler.last_stats)
        steps = st["decode_steps"]
        avg_ctx = prompt + new_tokens / 2
        step_bytes = weight_bytes + kv_bytes_per_token(s) * avg_ctx * batch
        measured_bw = b.results["sections"].get("ceilings", {}).get("copy_tb_s", MEASURED_HBM_TBS)
        roofline = batch / (step_bytes / (measured_bw * 1e12))
        tok_s = batch * steps / st["decode_s"]
        rows.append({"batch": batch, "decode_tok_s": tok_s, "step_ms": st["decode_s"] / steps * 1e3,
                     "prefill_s": st["prefill_s"], "first_call_s": first, "roofline_tok_s": roofline,
                     "fraction_of_roofline": tok_s / roofline, "bytes_per_step": step_bytes,
                     "cache_len": st["cache_len"], "generated": st["generated_tokens"]})
    b.results["sections"][f"decode_{shape}"] = {"prompt": prompt, "new_tokens": new_tokens, "rows": rows}


def mismatch(b: Bench) -> None:
    """Sampler (bf16, batch 64, prompt 256, temperature 1) against the learner's full forward on the same
    parameters, in bf16 (same config) and in fp32 (parameters upcast, fp32 compute, XLA attention, highest
    matmul precision); for the residual stream in float32 (the default) and in bf16."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from actors.sampler import Sampler, SamplerConfig, SamplingParams
    from learner.model import Transformer, token_logprobs

    s = SHAPES["0.5B"]
    n_prompt = SIZES["prompt"]
    prompts = np.random.default_rng(64).integers(0, s["vocab_size"], (64, n_prompt)).tolist()

    def lp_fn(gd):
        @jax.jit
        def f(st, tokens):
            m = nnx.merge(gd, st)
            inputs = tokens[:, :-1]
            pos = jnp.broadcast_to(jnp.arange(inputs.shape[1], dtype=jnp.int32)[None], inputs.shape)
            return token_logprobs(m(inputs, pos), tokens[:, 1:], 1.0)[:, n_prompt - 1:]
        return f

    def stats(a, ref):
        d = np.abs(a - ref)
        return {"mean_abs": float(d.mean()), "p50_abs": float(np.percentile(d, 50)),
                "p99_abs": float(np.percentile(d, 99)), "max_abs": float(d.max())}

    res = {}
    f32_fn = None
    for residual_float32 in (True, False):
        if b.left() < 25:
            break
        model = _peaked_05b(b, residual_float32)
        sampler = Sampler(model, SamplerConfig(decode_chunk_steps=16))
        outs = sampler.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=SIZES["new_tokens"]), seed=1)
        seqs = np.asarray([p + o.tokens for p, o in zip(prompts, outs)], np.int32)
        sampled = np.stack([o.logprobs for o in outs])
        del sampler
        graphdef, state = nnx.split(model)
        f32_cfg = model.config.replace(param_dtype="float32", dtype="float32", attention_impl="xla")
        f32_graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(f32_cfg, nnx.Rngs(0))))
        f32_state = jax.tree.map(lambda x: x.astype(jnp.float32), state)
        bf16_fn = lp_fn(graphdef)
        f32_fn = f32_fn or lp_fn(f32_graphdef)
        learner16, learner32 = [], []
        for i in range(0, len(seqs), 16):
            chunk = jnp.asarray(seqs[i:i + 16])
            learner16.append(np.asarray(bf16_fn(state, chunk)))
            with jax.default_matmul_precision("highest"):
                learner32.append(np.asarray(f32_fn(f32_state, chunk)))
        learner16, learner32 = np.concatenate(learner16), np.concatenate(learner32)
        key = "residual_fp32" if residual_float32 else "residual_bf16"
        res[key] = {"sampler_vs_bf16_learner": stats(sampled, learner16),
                    "sampler_vs_fp32_learner": stats(sampled, learner32),
                    "bf16_learner_vs_fp32_learner": stats(learner16, learner32),
                    "mean_nll_fp32": float(-learner32.mean()), "tokens": int(sampled.size)}
        b.results["sections"]["mismatch"] = res
        b.save()
        del model, state, f32_state


def long_context(b: Bench) -> None:
    import jax
    import numpy as np
    from flax import nnx

    from actors.sampler import Sampler, SamplerConfig, SamplingParams
    from learner.model import ModelConfig

    s = SHAPES["0.5B"]
    rec = {}
    impl = b.long_attention or "chunked"
    cfg = ModelConfig(**s, param_dtype="bfloat16", dtype="bfloat16", attention_impl=impl, attention_chunk_size=256)
    graphdef, state = _init_state(cfg)
    sampler = Sampler(nnx.merge(graphdef, state), SamplerConfig(decode_chunk_steps=16))
    del state
    prompts = np.random.default_rng(3).integers(0, s["vocab_size"], (8, SIZES["long_prompt"])).tolist()
    t = time.perf_counter()
    outs = sampler.generate(prompts, SamplingParams(max_new_tokens=SIZES["long_new"]), seed=0)
    st = sampler.last_stats
    rec["prefill_decode_b8"] = {"prompt": SIZES["long_prompt"], "new_tokens": SIZES["long_new"], "wall_s": time.perf_counter() - t,
                                "prefill_s_incl_compile": st["prefill_s"], "decode_s_incl_compile": st["decode_s"],
                                "generated": sum(len(o.tokens) for o in outs), "cache_len": st["cache_len"],
                                "attention": impl,
                                "process_peak_bytes_in_use": (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")}
    del sampler
    b.results["sections"]["long"] = rec
    b.save()
    if b.left() < 25:
        return
    cfg = cfg.replace(param_dtype="float32", remat=True)
    graphdef, state = _init_state(cfg)
    seq = SIZES["long_seq"]
    step = _train_step(graphdef, chunked=SIZES["logits_chunk"])
    tokens = jax.numpy.asarray(np.random.default_rng(4).integers(0, s["vocab_size"], (1, seq + 1), np.int32))
    t = time.perf_counter()
    compiled = step.lower(state, tokens).compile()
    try:
        ma = compiled.memory_analysis()
        mem = {k: getattr(ma, k, None) for k in ("temp_size_in_bytes", "argument_size_in_bytes",
                                                  "output_size_in_bytes", "generated_code_size_in_bytes")}
    except Exception as e:  # not every backend reports it
        mem = {"error": str(e)}
    jax.block_until_ready(compiled(state, tokens))
    first = time.perf_counter() - t
    dt = _time(lambda: jax.block_until_ready(compiled(state, tokens)), 2)
    stats = jax.devices()[0].memory_stats() or {}
    flops = train_flops_per_token(s, seq) * seq
    rec["fwd_bwd_32k_remat"] = {"seq": seq, "step_s": dt, "first_call_s": first, "tokens_per_s": seq / dt,
                                "tflops_model": flops / dt / 1e12, "process_peak_bytes_in_use": stats.get("peak_bytes_in_use"),
                                "compiled_memory": mem, "attention": impl}


def table(results: dict) -> str:
    lines = []
    sec = results["sections"]
    if "ceilings" in sec:
        c = sec["ceilings"]
        lines.append(f"ceilings: bf16 matmul {c['matmul_bf16_tflops']:.0f} TFLOP/s, copy {c['copy_tb_s']:.2f} TB/s "
                     f"({c['device']}, jax {c['jax']})")
    for shape in SHAPES:
        r = sec.get(f"train_{shape}")
        if r:
            lines.append(f"train {shape:>4} b{r['batch']} x {r['seq']}: {r['tokens_per_s']:,.0f} tok/s, "
                         f"{r['tflops']:.0f} TFLOP/s, MFU {100 * r['mfu_measured_ceiling']:.1f}% of 790 "
                         f"({100 * r['mfu_datasheet']:.1f}% of 989), attention {r['attention']}")
    hf = {(r["shape"], r["batch"]): r for r in sec.get("hf", [])}
    for shape in SHAPES:
        r = sec.get(f"decode_{shape}")
        for row in (r or {}).get("rows", []):
            h = hf.get((shape, row["batch"]))
            vs = f", transformers {h['decode_tok_s']:,.0f} tok/s ({row['decode_tok_s'] / h['decode_tok_s']:.1f}x)" if h else ""
            lines.append(f"decode {shape:>4} b{row['batch']:<3}: {row['decode_tok_s']:,.0f} tok/s "
                         f"({row['step_ms']:.2f} ms/step), {100 * row['fraction_of_roofline']:.0f}% of HBM roofline "
                         f"{row['roofline_tok_s']:,.0f}{vs}")
    for (shape, batch), h in sorted(hf.items()):
        if not any(row["batch"] == batch for row in sec.get(f"decode_{shape}", {}).get("rows", [])):
            lines.append(f"transformers {shape} b{batch}: {h['decode_tok_s']:,.0f} tok/s")
    for key, m in sec.get("mismatch", {}).items():
        for k in ("sampler_vs_bf16_learner", "sampler_vs_fp32_learner", "bf16_learner_vs_fp32_learner"):
            lines.append(f"{key} {k}: mean {m[k]['mean_abs']:.2e}, p99 {m[k]['p99_abs']:.2e}, "
                         f"max {m[k]['max_abs']:.2e} over {m['tokens']} tokens (NLL {m['mean_nll_fp32']:.2f})")
    lg = sec.get("long", {})
    if "prefill_decode_b8" in lg:
        r = lg["prefill_decode_b8"]
        peak = (r.get("process_peak_bytes_in_use") or 0) / 2**30
        lines.append(f"32k prefill b8 + 64 decode steps: OK, {r['wall_s']:.1f} s wall incl. compile "
                     f"({r['attention']}), process peak {peak:.1f} GiB")
    if "fwd_bwd_32k_remat" in lg:
        r = lg["fwd_bwd_32k_remat"]
        temp = (r.get("compiled_memory") or {}).get("temp_size_in_bytes") or 0
        lines.append(f"32k fwd+bwd remat 0.5B: OK, {r['step_s']:.2f} s/step, compiled temp "
                     f"{temp / 2**30:.1f} GiB, process peak {(r['process_peak_bytes_in_use'] or 0) / 2**30:.1f} GiB")
    for k, v in results["errors"].items():
        lines.append(f"!! {k}: {v[:300]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--budget-s", type=float, default=280.0)
    ap.add_argument("--sections", default="hf,ceilings,attn,train,decode,mismatch,long")
    ap.add_argument("--mem-fraction", type=float, default=0.92)
    ap.add_argument("--attention", default=None, help="force an attention implementation (xla|cudnn|chunked)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and sizes: check the code paths on CPU")
    ap.add_argument("--hf-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_worker:
        hf_worker(args.hf_worker)
        return
    if args.smoke:
        SHAPES.update(SMOKE_SHAPES)
        SIZES.update(SMOKE_SIZES)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sections = set(args.sections.split(","))
    b = Bench(out, args.budget_s, args.attention)
    b.results["command"] = " ".join(sys.argv)
    b.results["date"] = time.strftime("%Y-%m-%d %H:%M:%S")

    if "hf" in sections:
        runs = [["0.5B", [64, 1, 16]], ["7B", [1]]]
        b.section("hf", lambda: b.results["sections"].__setitem__(
            "hf", run_hf(runs, SIZES["prompt"], SIZES["hf_new"], 150, args.smoke)))

    from actors.sampler import configure_device_memory
    configure_device_memory(fraction=args.mem_fraction)
    import jax

    b.results["devices"] = [str(d) for d in jax.devices()]
    if "ceilings" in sections:
        b.section("ceilings", lambda: ceilings(b), 10)
    if "attn" in sections:
        b.section("attn", lambda: attention_check(b), 10)
        if b.attention is None:
            b.attention, b.long_attention = "xla", "chunked"
    if "train" in sections:
        b.section("train_7B", lambda: train(b, "7B", 1, SIZES["train_seq"], 3), 40)
        b.section("train_0.5B", lambda: train(b, "0.5B", 4, SIZES["train_seq"], 5), 30)
    if "long_first" in sections:  # a fresh process: the peak memory figures are the long runs' own
        b.section("long", lambda: long_context(b), 30)
    if "decode" in sections:
        b.section("decode_0.5B", lambda: decode(b, "0.5B", [64, 1, 16], SIZES["prompt"], SIZES["new_tokens"],
                                                 model=_peaked_05b(b)), 30)
    if "mismatch" in sections:
        b.section("mismatch", lambda: mismatch(b), 30)
    if "decode" in sections:
        b.section("decode_7B", lambda: decode(b, "7B", [1, 64, 16], SIZES["prompt"], SIZES["new_tokens"]), 30)
    if "long" in sections:
        b.section("long", lambda: long_context(b), 30)
    b.save()
    print("\n== model benchmark ==")
    print(table(b.results))


if __name__ == "__main__":
    main()
