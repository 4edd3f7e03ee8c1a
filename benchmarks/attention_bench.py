"""cuDNN attention of the learner's update shape, side by side in one run: packed rows through the dense
[B, 1, T, T] mask (jax.nn.dot_product_attention's mask argument; its backward also computes the mask's
gradient), through cuDNN's packed layout (learner.model.packed_segments), and plain causal attention without
segments (the floor: what one sequence per row costs).

Shape: the 0.5B model's attention (14 query heads, 2 kv heads, head dim 64, bf16) at B rows x T tokens.
FLOPs counted as causal within each segment (2 * L^2 * H * Dh forward per segment of L tokens, half of the full
4 * L^2 * H * Dh; the backward 2.5x the forward). Times: median of
`--reps` calls after one compile call, each blocked until ready. Needs an NVIDIA GPU of Hopper or newer (the
packed layout).

    python3 benchmarks/attention_bench.py --rows 4 --seq 8192 --segments 1,8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time(fn, args, reps: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def segment_rows(rows: int, seq: int, n: int):
    """`[rows, seq]` int32 ids: n segments of equal length per row, the last one 3% short (padding at the end)."""
    import numpy as np

    seg = np.zeros((rows, seq), np.int32)
    used = seq - max(1, seq // 32) if n > 1 else seq
    bounds = np.linspace(0, used, n + 1).astype(int)
    for i in range(n):
        seg[:, bounds[i]:bounds[i + 1]] = i + 1
    return seg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--segments", default="1,8", help="segments per row, comma-separated")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from learner.model import ModelConfig, attend, packed_segments

    h, kh, dh = 14, 2, 64
    b, t = args.rows, args.seq
    cfg = ModelConfig(num_heads=h, num_kv_heads=kh, head_dim=dh, dtype="bfloat16", attention_impl="cudnn")
    mask_cfg = cfg.replace(attention_max_segments=0)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((b, t, n, dh)), jnp.bfloat16) for n in (h, kh, kh))
    ct = jnp.asarray(rng.standard_normal((b, t, h, dh)), jnp.bfloat16)

    def run(c, seg):
        lens = [t] * b if seg is None else [int(x) for x in np.unique(np.asarray(seg), return_counts=True)[1][
            np.unique(np.asarray(seg)) != 0]]
        if seg is not None:  # every row has the same segments: counts over the batch / rows
            lens = [n // b for n in lens] * b
        fwd_flops = sum(2 * n * n * h * dh for n in lens)
        fwd = jax.jit(lambda q, k, v, s: attend(c, q, k, v, s))

        def loss(q, k, v, s):
            return jnp.sum((attend(c, q, k, v, s) * ct).astype(jnp.float32))

        both = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        f = _time(fwd, (q, k, v, seg), args.reps)
        fb = _time(both, (q, k, v, seg), args.reps)
        return {"fwd_ms": 1e3 * f, "fwd_bwd_ms": 1e3 * fb, "fwd_tflops": fwd_flops / f / 1e12,
                "fwd_bwd_tflops": 3.5 * fwd_flops / fb / 1e12}

    rows = []
    r = run(cfg, None)
    rows.append({"path": "causal, no segments", "segments": 1, **r})
    print(json.dumps(rows[-1]), flush=True)
    for n in (int(x) for x in args.segments.split(",")):
        seg = jnp.asarray(segment_rows(b, t, n))
        packed_ok = bool(packed_segments(seg, cfg.attention_max_segments)[2])
        for name, c in (("dense mask", mask_cfg), ("packed layout" if packed_ok else "chunked XLA (not packed)", cfg)):
            try:
                r = run(c, seg)
            except Exception as e:  # noqa: BLE001 - XLA / cuDNN raise their own types; record and go on
                r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            rows.append({"path": name, "segments": n, **r})
            print(json.dumps(rows[-1]), flush=True)
    meta = {"device": str(jax.devices()[0]), "jax": jax.__version__, "rows": b, "seq": t, "heads": h,
            "kv_heads": kh, "head_dim": dh, "reps": args.reps}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nattention {b} x {t}, {h}/{kh} heads x {dh}, bf16, {meta['device']}, jax {meta['jax']}")
    print("| path | segments/row | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['path']} | {r['segments']} | error: {r['error'][:80]} | | | |")
        else:
            print(f"| {r['path']} | {r['segments']} | {r['fwd_ms']:.2f} | {r['fwd_tflops']:.0f} | "
                  f"{r['fwd_bwd_ms']:.2f} | {r['fwd_bwd_tflops']:.0f} |")


if __name__ == "__main__":
    main()
