"""Build the demonstration-family splits: `python -m tasks.builtin.build_family [--n 288] [--eval 24]`.

The tasks a small model trained from scratch can learn to solve and be evaluated on without demonstrations:
compositions of the operators the demonstration generator covers (the fused family of `tasks.demos.ir`:
pointwise activations and arithmetic, at most one row reduction / normalisation / softmax, last-axis scan or
matrix product). Same synthesis and execution filter as `tasks.builtin.build` (eager and torch.compile,
determinism, degeneracy, liveness, 0.1-20 ms eager at one thread, autosize), with the graph composer restricted to
those operators and every candidate also required to translate (`tasks.demos.ir.translate`). Near-duplicates of
the other built-in splits are rejected (during synthesis for the CPU splits, afterwards for the others), so this
set shares no task with them.

Then `--eval` of the accepted tasks are set aside as `cpu_family_eval` (stratified by category, as
`tasks.builtin.build.stratified_eval`), the rest are `cpu_family_train`, less the few whose compact
demonstration the sandbox does not pass (a training task must come with a correct demonstration; recorded in
the manifest). The eval split never receives
demonstrations; its tasks are new compositions of the same operators, so a policy can generalise to them.
Writes cpu_family_train.jsonl / cpu_family_eval.jsonl next to this file and a "family" entry in MANIFEST.json.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from tasks.builtin import HERE, load_split
from tasks.builtin.build import renumber, stratified_eval
from tasks.compose import ComposeConfig, GraphComposer
from tasks.dedup import DedupIndex
from tasks.filtering import FilterConfig
from tasks.loaders import load_jsonl, write_jsonl
from tasks.operators import REGISTRY
from tasks.synthesize import SynthesisConfig, Synthesizer

SEED = 3003
FAMILY_OPS = frozenset({
    # activations (glu halves a dimension: outside the family)
    "relu", "relu6", "gelu", "silu", "sigmoid", "tanh", "softplus", "elu", "leaky_relu", "hardtanh", "hardswish",
    "hardsigmoid", "mish", "selu", "celu", "softsign", "logsigmoid", "tanhshrink", "softshrink", "hardshrink",
    "prelu",
    # elementwise arithmetic and functions
    "abs", "neg", "exp", "log1p", "sqrt", "rsqrt", "square", "sin", "cos", "erf", "atan", "reciprocal", "clamp",
    "scale", "shift", "pow", "add", "sub", "mul", "div", "maximum", "minimum", "where", "lerp", "bias_add",
    "scale_mul", "addcmul",
    # one core op: row reductions / normalisations / softmaxes, scans, matrix products
    "sum", "mean", "amax", "amin", "var", "std", "logsumexp", "vector_norm", "max_dim",
    "layer_norm", "rms_norm", "l2_normalize", "softmax", "log_softmax", "softmin",
    "cumsum", "cumprod", "logcumsumexp", "cummax", "cummin",
    "linear", "linear_nobias", "matmul_input", "gram", "bmm_input", "addmm", "einsum",
})


def in_family(source: str) -> bool:
    """Whether the demonstration generator covers a reference source."""
    from tasks.demos.ir import Unsupported, translate

    try:
        translate(source)
    except (Unsupported, SyntaxError):
        return False
    return True


def family_composer(seed: int, min_depth: int = 2, max_depth: int = 4) -> GraphComposer:
    """The graph composer over FAMILY_OPS that only returns references `in_family`."""
    registry = tuple(op for op in REGISTRY if op.name in FAMILY_OPS)
    return GraphComposer(ComposeConfig(seed=seed, min_depth=min_depth, max_depth=max_depth, max_attempts=200),
                         registry=registry, accept=in_family)


def demo_failures(tasks) -> dict[str, str]:
    """{synthesized task id: why} for the tasks whose cpu "compact" demonstration the sandbox does not pass
    (verification only, 2 trials: ill-conditioned compositions such as a sine after a long cumulative product)."""
    from sandbox.config import SandboxConfig
    from sandbox.evaluator import Evaluator
    from tasks.demos import demonstrations

    out = {}
    with Evaluator(SandboxConfig(backend="cpu", profile=False, use_compile=False, num_trials=2)) as ev:
        for t in tasks:
            demo = next((d for d in demonstrations(t, ("cpu",)) if d.variant == "compact"), None)
            if demo is None:
                out[t.id] = "no compact demonstration"
                continue
            res = ev.evaluate(t, demo.files, "cpu")
            if res.status != "ok":
                out[t.id] = f"{res.status}: {res.message}"
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=288, help="accepted tasks in all")
    ap.add_argument("--eval", type=int, default=24, help="of them, evaluation tasks")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default="runs/builtin_build")
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args(argv)
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    exclude = [str(HERE / f"{s}.jsonl") for s in ("cpu_train", "cpu_eval") if (HERE / f"{s}.jsonl").exists()]
    cfg = SynthesisConfig(n=args.n, out=str(work / "family.jsonl"), seed=SEED, exclude=exclude,
                          filter=FilterConfig(autosize=True, workers=args.workers),
                          compose=ComposeConfig(min_depth=2, max_depth=4))
    composer = family_composer(SEED, cfg.compose.min_depth, cfg.compose.max_depth)

    def progress(rep) -> None:
        if rep.run_candidates % 20 == 0:
            print(f"  family: {rep.accepted}/{args.n} accepted of {rep.candidates} candidates, "
                  f"{rep.accepted_per_min:.1f}/min", flush=True)

    rep = Synthesizer(cfg, composer).run(on_progress=progress)
    print(f"family: accepted {rep.accepted} of {rep.candidates} in {rep.elapsed_s:.0f} s; rejections {rep.reasons}",
          flush=True)
    tasks = [t for t in load_jsonl(cfg.out) if in_family(t.reference)]  # autosize keeps the family; checked again
    others = DedupIndex(cfg.same_ops_similarity, cfg.source_similarity)  # every other built-in split
    for name in ("single_op", "cpu_train", "cpu_eval", "gpu_train", "gpu_eval"):
        try:
            for t in load_split(name):
                others.add(t.id, t.metadata.get("signature", ()), t.reference)
        except FileNotFoundError:
            continue
    dropped = [t.id for t in tasks if others.find(t.metadata.get("signature", ()), t.reference) is not None]
    tasks = [t for t in tasks if t.id not in set(dropped)]
    print(f"family: {len(dropped)} near-duplicates of other built-in splits dropped", flush=True)
    train, ev = stratified_eval(tasks, args.eval)
    unverified = demo_failures(train)  # a training task must come with a correct demonstration
    train = [t for t in train if t.id not in unverified]
    print(f"family: {len(unverified)} training tasks dropped, their compact demonstration fails the sandbox: "
          f"{sorted(unverified.items())}", flush=True)
    splits = {"cpu_family_train": renumber(train, "cpu_fa_tr", "cpu_family_train"),
              "cpu_family_eval": renumber(ev, "cpu_fa_ev", "cpu_family_eval")}
    for name, ts in splits.items():
        write_jsonl(ts, out / f"{name}.jsonl")
    mpath = out / "MANIFEST.json"
    manifest = json.loads(mpath.read_text()) if mpath.exists() else {}
    manifest["family"] = {
        "dropped_train_tasks_demo_fails": {k: v[:200] for k, v in sorted(unverified.items())},
        "dropped_near_duplicates": dropped,
        "built": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m tasks.builtin.build_family " + " ".join(sys.argv[1:] if argv is None else argv),
        "seed": SEED, "counts": {k: len(v) for k, v in splits.items()},
        "synthesis": {"accepted": rep.accepted, "candidates": rep.candidates, "rejections": rep.reasons},
        "categories": {k: sorted({t.category for t in v}) for k, v in splits.items()},
    }
    mpath.write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest["family"]["counts"]))


if __name__ == "__main__":
    main()
