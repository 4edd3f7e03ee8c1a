"""Benchmarks of the main job (`cuda-agent train`), results recorded in benchmarks/RESULTS.md.

    python benchmarks/train_bench.py sft   [--preset local]          # warm-start step throughput of the preset's model
    python benchmarks/train_bench.py runs  [--preset local] [--seeds 0,1,2] [--out runs/bench] [--parallel]
                                                                     # whole runs: wall time, eval after each stage
    python benchmarks/train_bench.py baseline-cache                  # torch.compile baseline: fresh vs cached
    python benchmarks/train_bench.py sampled [--preset local] [--seeds 0,1,2] [--out runs/bench] [--samples 8]
                                     [--temperature 1.0] [--stages warm_start,single_turn_ppo,rft,multi_turn_ppo]
                                     [--split eval|rollout] [--mode single_turn|multi_turn]
                                                                     # each finished run's stage policies, sampled

`sft` builds the preset's model and demonstrations exactly as the stage worker does and times a few optimiser
steps (wall and process CPU time: on a shared machine the CPU seconds say what an idle one would take).
`runs` runs `cuda-agent train --preset P seed=S` once per seed, one after the other (`--parallel`: all at once, each
with its own cache folder: for a host with the cores and accelerator memory for several), and prints per seed the total
wall time, each stage's duration, and the mean milestone reward / pass rate / build rate of every evaluation on
the held-out split (and on the training probe), then the mean over seeds: the measurement the issue asks for
("learning is visible ... over 3 seeds").
`sampled` evaluates the policy each stage of those runs left (`policies/<stage>`) on the run's held-out split with
`cuda-agent eval --samples N --temperature T` (N samples per task: a pass rate over N x 24 samples instead of 24
greedy answers), one evaluation at a time, and prints per stage and seed the sampled pass rate, mean milestone
reward and pass@N (tasks with a correct sample), then the means over seeds and each stage's change against the
warm start's in the same seed. `--mode multi_turn` runs those episodes as the agent loop (the turns and context of
the run's multi-turn PPO stage, compile / verify / profile tools and their feedback) whatever the run's own
eval.mode, tagged "-mt".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def bench_sft(preset: str, steps: int) -> None:
    import jax
    import numpy as np

    from cuda_agent.config import load_config
    from cuda_agent.corpus import composed_tasks, train_and_eval_tasks
    from cuda_agent.prepare import prepare_model
    from cuda_agent.stage_worker import _micro, demo_sequences, microbatch_rows, row_length
    from cuda_agent.train_config import TrainConfig
    from learner.batch import pack_trajectories
    from learner.chat import ChatFormat
    from learner.config import OptimizerConfig, PPOConfig
    from learner.hf_checkpoint import load_pretrained
    from learner.tokenizer import Tokenizer
    from learner.train_step import SequenceBatch, create_train_state, sft_train_step

    cfg = load_config(TrainConfig, REPO / "configs" / f"{preset}.yaml")
    tr, ev = train_and_eval_tasks(cfg.tasks.train, cfg.tasks.eval, "cpu")
    folder = Path("/tmp") / f"train_bench_model_{preset}"
    composed = composed_tasks(cfg.stages.warm_start.composed_tasks, cfg.seed, ev)
    info = prepare_model(folder, cfg.model, cfg.tokenizer, tr + composed, ev, "cpu", 0, cfg.actor.agent.skill,
                         tuple(cfg.stages.warm_start.variants))
    tok = Tokenizer.from_file(folder)
    seqs, dinfo = demo_sequences(cfg, ChatFormat(tok), tr, "cpu", composed)
    ws = cfg.stages.warm_start
    row_len = row_length(ws, seqs, ws.max_seq_len)
    batch, _ = pack_trajectories(seqs, row_len, rows_multiple=ws.batch_rows, pack=True)
    micro = microbatch_rows(ws.microbatch_rows, ws.batch_rows)  # as the stage worker
    state = create_train_state(load_pretrained(folder), OptimizerConfig(lr=ws.lr, warmup_steps=1, decay_steps=100),
                               PPOConfig(minibatch_size=ws.batch_rows, microbatch_size=micro, logits_chunk_size=512))
    seq = SequenceBatch(batch.tokens, batch.positions, batch.segment_ids, batch.loss_mask)
    idx = np.arange(ws.batch_rows)
    mb = _micro(seq, idx, micro)
    tokens = int(np.count_nonzero(batch.segment_ids[idx]))
    w0, c0 = time.perf_counter(), time.process_time()
    state, m = sft_train_step(state, mb)
    jax.block_until_ready(m)
    compile_wall, compile_cpu = time.perf_counter() - w0, time.process_time() - c0
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        state, m = sft_train_step(state, mb)
    jax.block_until_ready(m)
    wall, cpu = (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps
    epoch_tokens = int(np.count_nonzero(batch.segment_ids))
    print(f"preset {preset}: model {info.get('params')} params, vocab {info.get('vocab_size')}; "
          f"{dinfo['demos/sequences']} demonstration sequences ({dinfo['demos/too_long']} too long) in "
          f"{batch.num_rows} rows of {row_len} tokens; {epoch_tokens} tokens per epoch")
    print("| figure | value |\n| --- | --- |")
    print(f"| first step (compile + run), wall / CPU s | {compile_wall:.1f} / {compile_cpu:.1f} |")
    print(f"| step of {ws.batch_rows} rows ({tokens} tokens), wall / CPU s | {wall:.2f} / {cpu:.2f} |")
    print(f"| tokens/s, wall / per CPU-second | {tokens / wall:,.0f} / {tokens / cpu:,.0f} |")
    print(f"| steps per epoch | {batch.num_rows // ws.batch_rows} |")
    print(f"| load average (1 min) | {os.getloadavg()[0]:.1f} |")


_CACHE_CHILD = """
import json, sys, time
from pathlib import Path
from sandbox.config import SandboxConfig
from sandbox.evaluator import Evaluator
from sandbox.files import load_solution, load_task
task = load_task(Path(sys.argv[1])); files = load_solution(Path(sys.argv[2]))
t0 = time.perf_counter()
with Evaluator(SandboxConfig(backend="cpu", use_compile=True)) as ev:
    r1 = ev.evaluate(task, files, "cpu")
    t1 = time.perf_counter()
    r2 = ev.evaluate(task, files, "cpu")
    t2 = time.perf_counter()
print(json.dumps({"status": r1.status, "first_s": t1 - t0, "second_s": t2 - t1,
                  "first_profile_ms": r1.stage_ms.get("profile"), "second_profile_ms": r2.stage_ms.get("profile"),
                  "compile_ms": r1.timing.compiled.median_ms if r1.timing and r1.timing.compiled else None}))
"""


def bench_baseline_cache() -> None:
    """What keeping baselines costs: evaluations of one correct solution with the torch.compile baseline, in a
    fresh process with an empty inductor cache, then in a second process on the filled cache (what a later run
    or a restarted sandbox node pays), each evaluating twice (the second reuses the worker's compiled graph, as
    every later episode of a run does)."""
    import tempfile

    corpus = REPO / "tests" / "data" / "corpus" / "cumsum"
    cache = Path(tempfile.mkdtemp(prefix="inductor-bench-"))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    rows = []
    for label in ("empty inductor cache", "inductor cache from the first process"):
        out = subprocess.run([sys.executable, "-c", _CACHE_CHILD, str(corpus), str(corpus / "cpu" / "fast")],
                             cwd=REPO, env=env, capture_output=True, text=True, check=True)
        rows.append((label, json.loads(out.stdout.strip().splitlines()[-1])))
    print("| process | first evaluation (s) | its profile stage (ms) | second evaluation (s) | its profile "
          "stage (ms) |\n| --- | --- | --- | --- | --- |")
    for label, r in rows:
        print(f"| {label} | {r['first_s']:.1f} | {r['first_profile_ms']:.0f} | {r['second_s']:.1f} | "
              f"{r['second_profile_ms']:.0f} |")
    print(f"load average (1 min) {os.getloadavg()[0]:.1f}; status {rows[0][1]['status']}")


def _eval_rows(run: Path) -> list[dict]:
    rows = []
    for p in sorted((run / "eval").glob("*.json")):
        d = json.loads(p.read_text())
        m = d["metrics"]["overall"]
        sc = m.get("status_counts", {})
        built = sum(v for k, v in sc.items() if k in ("ok", "incorrect", "runtime_error", "load_error", "timeout"))
        rows.append({"tag": d["tag"], "split": d.get("split", "eval"), "order": d.get("order", 0),
                     "mean_reward": m["mean_reward"], "pass_rate": m["pass_rate"],
                     "build_rate": built / max(m["samples"], 1), "samples": m["samples"],
                     "wall_s": d.get("wall_s")})
    return sorted(rows, key=lambda r: r["order"])


def _run_args(preset: str, seed: int, run: Path, extra: list[str]) -> list[str]:
    if (run / "config.yaml").exists():
        return [sys.executable, "-m", "cuda_agent.cli", "train", "--quiet", "--resume", str(run)]
    return [sys.executable, "-m", "cuda_agent.cli", "train", "--quiet", "--preset", preset, "--run-dir", str(run),
            f"seed={seed}", *extra]


def _finished(run: Path) -> bool:
    return (run / "state.json").exists() and json.loads((run / "state.json").read_text()).get("status") == "finished"


def bench_runs(preset: str, seeds: list[int], out: Path, extra: list[str], parallel: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    runs = {seed: out / f"{preset}-seed{seed}" for seed in seeds}
    todo = [s for s in seeds if not _finished(runs[s])]
    for s in set(seeds) - set(todo):
        print(f"seed {s}: reusing finished run {runs[s]}")
    t0 = time.monotonic()
    procs = {}
    for seed in todo:
        # in parallel, each run its own cache folder: concurrent runs must not build the same cache entries at once
        own_cache = [f"cache_dir={out / f'cache-seed{seed}'}"] if parallel else []
        log = open(out / f"{preset}-seed{seed}.log", "a")
        # in parallel, each run in its own session: a Ctrl-C / `timeout -s INT` reaches this process only, which
        # forwards exactly one SIGINT (a driver takes a second one as "kill everything now, no checkpoint")
        procs[seed] = (subprocess.Popen(_run_args(preset, seed, runs[seed], own_cache + extra), cwd=REPO, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=parallel), log)
        if not parallel:
            rc = procs[seed][0].wait()
            print(f"seed {seed}: exit {rc} after {time.monotonic() - t0:.0f} s (log {log.name})")
            t0 = time.monotonic()
    if parallel:
        def on_term(*_):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, on_term)
        try:
            left = dict(procs)
            while left:  # each run's exit reported when it happens, not in seed order
                for seed, (proc, log) in list(left.items()):
                    if proc.poll() is not None:
                        print(f"seed {seed}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s (log {log.name})")
                        del left[seed]
                time.sleep(1.0)
        except KeyboardInterrupt:  # a time limit: each run stops with a checkpoint; report what they finished
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for seed, (proc, _) in procs.items():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 60
            for seed, (proc, _) in procs.items():
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()  # its supervisor's children get SIGTERM (PR_SET_PDEATHSIG)
                    proc.wait()
                print(f"seed {seed}: stopped at the time limit (exit {proc.returncode})")
    for _, log in procs.values():
        log.close()
    results = []
    for seed in seeds:
        run = runs[seed]
        if not (run / "state.json").exists():
            print(f"seed {seed}: no state.json in {run}: the run did not start")
            continue
        state = json.loads((run / "state.json").read_text())
        results.append({"seed": seed, "status": state.get("status"), "elapsed_s": state.get("elapsed_s"),
                        "stages": {k: v.get("duration_s") for k, v in state.get("stages", {}).items()},
                        "evals": _eval_rows(run)})
    if not results:
        raise SystemExit("no run to report")
    print("\n| seed | status | wall (min) | " + " | ".join(
        f"{s} (s)" for s in results[0]["stages"]) + " |")
    print("|" + " --- |" * (3 + len(results[0]["stages"])))
    for r in results:
        print(f"| {r['seed']} | {r['status']} | {(r['elapsed_s'] or 0) / 60:.1f} | " + " | ".join(
            "-" if v is None else f"{v:.0f}" for v in r["stages"].values()) + " |")
    tags = [e["tag"] for e in results[0]["evals"]]
    print("\n| evaluation | split | " + " | ".join(f"seed {r['seed']} reward / pass / built" for r in results)
          + " | mean reward | mean pass rate | mean build rate | mean wall (s) |")
    print("|" + " --- |" * (6 + len(results)))
    for tag in tags:
        cells, rw, pr, br, wall = [], [], [], [], []
        split = "eval"
        for r in results:
            e = next((x for x in r["evals"] if x["tag"] == tag), None)
            if e is None:
                cells.append("-")
                continue
            split = e["split"]
            cells.append(f"{e['mean_reward']:+.2f} / {e['pass_rate']:.0%} / {e['build_rate']:.0%}")
            rw.append(e["mean_reward"])
            pr.append(e["pass_rate"])
            br.append(e["build_rate"])
            if e.get("wall_s") is not None:  # the evaluation's wall time (the first one pays cold baselines)
                wall.append(e["wall_s"])
        mean = (lambda xs: sum(xs) / len(xs) if xs else float("nan"))
        print(f"| {tag} | {split} | " + " | ".join(cells) +
              f" | {mean(rw):+.3f} | {mean(pr):.1%} | {mean(br):.1%} | {mean(wall):.0f} |")
    (out / f"{preset}-summary.json").write_text(json.dumps(results, indent=2))


def _sampled_row(folder: Path) -> dict:
    """The overall KernelBench figures `cuda-agent eval` wrote (cuda_agent.kb_metrics) for one sampled evaluation."""
    m = json.loads((folder / "metrics.json").read_text())["metrics"]["overall"]
    return {"samples": m["samples"], "passed": round(m["pass_rate"] * m["samples"]), "pass_rate": m["pass_rate"],
            "mean_reward": m["mean_reward"], "tasks": m["tasks"], "tasks_solved": round(m["pass_at_n"] * m["tasks"])}


def bench_sampled(preset: str, seeds: list[int], out: Path, stages: list[str], samples: int, temperature: float,
                  extra: list[str], split: str = "eval", mode: str | None = None) -> None:
    """Sampled evaluations of every stage policy of the finished runs under `out` (see the module doc). split:
    "eval" (the held-out split, tasks/eval.jsonl) or "rollout" (the PPO stages' own tasks, tasks/rollout.jsonl);
    mode: None (the run's eval.mode), "single_turn" or "multi_turn" (the agent loop, tagged "-mt")."""
    if split not in ("eval", "rollout"):
        raise ValueError(f"split must be 'eval' or 'rollout', got {split!r}")
    if mode not in (None, "single_turn", "multi_turn"):
        raise ValueError(f"mode must be 'single_turn' or 'multi_turn', got {mode!r}")
    tag = ("" if split == "eval" else f"-{split}") + ("-mt" if mode == "multi_turn" else "")
    tag += "".join("-" + re.sub(r"[^\w.=-]", "_", x) for x in extra)  # results of other overrides kept apart
    from cuda_agent.config import load_config
    from cuda_agent.services import eval_args
    from cuda_agent.train_config import TrainConfig

    results: dict[int, dict[str, dict]] = {}
    for seed in seeds:
        run = out / f"{preset}-seed{seed}"
        if not (run / "config.yaml").exists():
            print(f"seed {seed}: no run at {run}")
            continue
        cfg = load_config(TrainConfig, run / "config.yaml")
        if mode is not None:
            cfg.eval.mode = mode
        if mode == "multi_turn":  # the episodes multi-turn PPO trained on: its turns and context
            mt = cfg.stages.multi_turn_ppo
            cfg.eval.max_turns = mt.max_turns
            cfg.eval.max_context_tokens = max(cfg.eval.max_context_tokens, mt.max_context_tokens)
        fmt = json.loads((run / "state.json").read_text())["format"]
        for stage in stages:
            policy = run / "policies" / stage
            if not (policy / "config.json").is_file():
                print(f"seed {seed}: no policy {policy}")
                continue
            folder = out / "sampled" / f"seed{seed}-{stage}{tag}-n{samples}-t{temperature:g}"
            if not (folder / "metrics.json").exists():
                t0 = time.monotonic()
                # the run's own evaluation settings (as cuda_agent.train's evaluations), but N samples at T, and
                # a local node with the run's verification and timing settings
                sb = cfg.node.sandbox
                cmd = [sys.executable, "-m", "cuda_agent.cli", "eval",
                       *eval_args(cfg, policy, run / "tasks" / f"{split}.jsonl", folder, fmt, samples=samples,
                                  temperature=temperature),
                       "--sandbox-workers", "1", "--sandbox-opt", f"sandbox.num_trials={sb.num_trials}",
                       "--sandbox-opt", f"sandbox.reps={sb.reps}", *extra]
                (out / "sampled").mkdir(parents=True, exist_ok=True)
                with open(out / "sampled" / f"seed{seed}-{stage}{tag}.log", "w") as log:
                    subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
                print(f"seed {seed} {stage}: evaluated in {time.monotonic() - t0:.0f} s")
            results.setdefault(seed, {})[stage] = _sampled_row(folder)
    if not results:
        raise SystemExit(f"no finished run with policies under {out}")
    print(f"\n{samples} samples per {'held-out' if split == 'eval' else 'rollout'} task at temperature {temperature:g}"
          f"{', multi-turn' if mode == 'multi_turn' else ''}: "
          "sampled pass rate (passed / samples), mean milestone reward, pass@N (tasks with a correct sample)")
    print("\n| policy | " + " | ".join(f"seed {s}" for s in results) + " | mean pass rate | mean reward | "
          "mean pass@N | pass rate vs warm start, per seed |")
    print("|" + " --- |" * (5 + len(results)))
    mean = (lambda xs: sum(xs) / len(xs) if xs else float("nan"))
    for stage in stages:
        cells, pr, rw, pk, delta = [], [], [], [], []
        for seed, per in results.items():
            r = per.get(stage)
            if r is None:
                cells.append("-")
                continue
            cells.append(f"{r['pass_rate']:.1%} ({r['passed']}/{r['samples']}) / {r['mean_reward']:+.3f} / "
                         f"{r['tasks_solved']}/{r['tasks']}")
            pr.append(r["pass_rate"])
            rw.append(r["mean_reward"])
            pk.append(r["tasks_solved"] / max(r["tasks"], 1))
            if "warm_start" in per:
                delta.append(f"{(r['pass_rate'] - per['warm_start']['pass_rate']) * 100:+.1f}")
        print(f"| {stage} | " + " | ".join(cells) + f" | {mean(pr):.1%} | {mean(rw):+.3f} | {mean(pk):.1%} | "
              + ", ".join(delta) + " |")
    (out / f"{preset}-sampled{tag}-n{samples}-t{temperature:g}.json").write_text(json.dumps(results, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("sft", "runs", "baseline-cache", "sampled"))
    p.add_argument("--preset", default="local")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default="runs/bench")
    p.add_argument("--parallel", action="store_true", help="`runs`: start every seed's run at once")
    p.add_argument("--samples", type=int, default=8, help="`sampled`: samples per held-out task")
    p.add_argument("--temperature", type=float, default=1.0, help="`sampled`: sampling temperature")
    p.add_argument("--stages", default="warm_start,single_turn_ppo,rft,multi_turn_ppo",
                   help="`sampled`: the stage policies to evaluate, in order")
    p.add_argument("--split", default="eval", choices=("eval", "rollout"),
                   help="`sampled`: the held-out split, or the PPO stages' own rollout tasks")
    p.add_argument("--mode", default=None, choices=("single_turn", "multi_turn"),
                   help="`sampled`: episodes as single replies or the multi-turn agent loop (default: the run's)")
    p.add_argument("overrides", nargs="*", help="key=value overrides for `runs` (actor overrides for `sampled`)")
    a = p.parse_intermixed_args()
    if a.what == "sft":
        bench_sft(a.preset, a.steps)
    elif a.what == "baseline-cache":
        bench_baseline_cache()
    elif a.what == "sampled":
        bench_sampled(a.preset, [int(x) for x in a.seeds.split(",")], Path(a.out), a.stages.split(","), a.samples,
                      a.temperature, a.overrides, a.split, a.mode)
    else:
        bench_runs(a.preset, [int(s) for s in a.seeds.split(",")], Path(a.out), a.overrides, a.parallel)


if __name__ == "__main__":
    main()
