"""Sandbox benchmark (issue 3): build latency (cubin vs extension), end-to-end evaluation time against a
CUDA-Agent-style flow, and timing noise. Prints a short table; writes bench.json under --out.

    python benchmarks/sandbox_bench.py --out OUTDIR [--backend cuda|cpu]

Sections (each runs on its own; a failing one is reported and the others still run):
  1. cubin build p50/p95: nvcc -cubin of the elementwise kernel, cache defeated by a unique comment per build.
  2. extension build p50/max: torch.utils.cpp_extension (torch/extension.h) of the same kernel, builds in parallel.
  3. end-to-end cubin evaluation p50/p95 (fresh build + 5 checks + profile, baselines cached), elementwise task.
  4. CUDA-Agent-style flow: extension build (section 2's median) + a separate verification process + a separate
     profiling process (each a fresh Python that imports torch, loads the module, and for profiling compiles
     the torch.compile baseline), measured in this run; ratio to section 3.
  5. timing noise: the same solution profiled 10 times (cached build): coefficient of variation of the medians.
On a CPU host (--backend cpu) sections 1-2, 4 are skipped and 3, 5 use the cpu format.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sandbox.build import build, jail_for_build  # noqa: E402
from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.evaluator import Evaluator  # noqa: E402
from sandbox.files import load_solution, load_task  # noqa: E402
from sandbox.workspace import Workspace  # noqa: E402

CORPUS = REPO / "tests" / "data" / "corpus"
TASK_DIR = CORPUS / "elementwise_chain"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def unique(files: dict[str, str], tag: str) -> dict[str, str]:
    """Defeat the build cache: append a comment to every kernel source."""
    return {k: (v + f"\n// bench {tag}\n" if k.startswith("kernels/") else v) for k, v in files.items()}


def bench_cubin_builds(ev: Evaluator, cfg: SandboxConfig, n: int) -> dict:
    files = load_solution(TASK_DIR / "cubin" / "fast")
    lat = []
    root = Path(tempfile.mkdtemp(prefix="bench-cubin-"))
    owner = ev.jail_uid if ev.isolation_mode == "namespaces" and (ev.jail_uid or 0) > 0 else -1
    for i in range(n):
        ws = Workspace.create(root, "", unique(files, f"c{i}-{time.time_ns()}"), "cubin", owner_uid=owner)
        jail = jail_for_build(ws, cfg) if ev.isolation_mode == "namespaces" else None
        t = time.perf_counter()
        r = build(ws, "cubin", cfg, jail, ev.arch)
        lat.append(time.perf_counter() - t)
        assert r.ok, r.log
    return {"n": n, "p50_s": pct(lat, 0.5), "p95_s": pct(lat, 0.95), "samples_s": lat, "arch": ev.arch}


def bench_extension_builds(ev: Evaluator, cfg: SandboxConfig, n: int) -> dict:
    files = load_solution(TASK_DIR / "extension" / "fast")
    root = Path(tempfile.mkdtemp(prefix="bench-ext-"))
    owner = ev.jail_uid if ev.isolation_mode == "namespaces" and (ev.jail_uid or 0) > 0 else -1

    def one(i: int) -> tuple[float, str]:
        ws = Workspace.create(root, "", unique(files, f"e{i}-{time.time_ns()}"), "extension", owner_uid=owner)
        jail = jail_for_build(ws, cfg) if ev.isolation_mode == "namespaces" else None
        t = time.perf_counter()
        r = build(ws, "extension", cfg, jail, ev.arch)
        so = ""
        if r.ok:
            m = json.loads(Path(r.manifest_path).read_text())
            a = m["artifacts"][0]
            so = json.dumps({"path": str(Path(tempfile.mkdtemp(prefix="bench-so-")) / Path(a["path"]).name),
                             "module": a["module_name"], "src": a["path"]})
            import shutil

            d = json.loads(so)
            shutil.copy2(d["src"], d["path"])
        assert r.ok, r.log[-2000:]
        return time.perf_counter() - t, so

    with cf.ThreadPoolExecutor(max_workers=n) as pool:
        res = list(pool.map(one, range(n)))
    lat = [r[0] for r in res]
    return {"n": n, "parallel": n, "p50_s": pct(lat, 0.5), "max_s": max(lat), "samples_s": lat, "so": res[0][1]}


def bench_e2e(ev: Evaluator, fmt: str, n: int) -> dict:
    task = load_task(TASK_DIR)
    files = load_solution(TASK_DIR / fmt / "fast")
    ev.evaluate(task, unique(files, "warm"), fmt)  # reference, compiled graph cached; not counted
    tot, stages, rewards = [], [], []
    for i in range(n):
        t = time.perf_counter()
        r = ev.evaluate(task, unique(files, f"x{i}-{time.time_ns()}"), fmt)
        tot.append(time.perf_counter() - t)
        assert r.ok, r.message
        stages.append(r.stage_ms)
        rewards.append(r.reward)
    keys = sorted({k for s in stages for k in s})
    return {"n": n, "p50_s": pct(tot, 0.5), "p95_s": pct(tot, 0.95), "samples_s": tot,
            "stage_p50_ms": {k: pct([s.get(k, 0.0) for s in stages], 0.5) for k in keys}, "rewards": rewards}


_VERIFY = r"""
import sys, json, importlib.machinery, importlib.util, torch
info = json.loads(sys.argv[1]); ref_src = open(sys.argv[2]).read()
loader = importlib.machinery.ExtensionFileLoader(info["module"], info["path"])
spec = importlib.util.spec_from_file_location(info["module"], info["path"], loader=loader)
mod = importlib.util.module_from_spec(spec); loader.exec_module(mod)
ns = {}; exec(ref_src, ns)
model = ns["Model"](*ns["get_init_inputs"]()).cuda()
for seed in range(5):
    torch.manual_seed(seed); x = [t.cuda() for t in ns["get_inputs"]()]
    torch.testing.assert_close(mod.forward(*x), model(*x), atol=1e-2, rtol=1e-2)
torch.cuda.synchronize(); print("verified")
"""

_PROFILE = r"""
import sys, json, importlib.machinery, importlib.util, torch
info = json.loads(sys.argv[1]); ref_src = open(sys.argv[2]).read()
loader = importlib.machinery.ExtensionFileLoader(info["module"], info["path"])
spec = importlib.util.spec_from_file_location(info["module"], info["path"], loader=loader)
mod = importlib.util.module_from_spec(spec); loader.exec_module(mod)
ns = {}; exec(ref_src, ns)
model = ns["Model"](*ns["get_init_inputs"]()).cuda().eval()
comp = torch.compile(model)
x = [t.cuda() for t in ns["get_inputs"]()]
def t(f, reps=20):
    for _ in range(3): f(*x)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(reps): f(*x)
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / reps
with torch.no_grad():
    print(json.dumps({"eager_ms": t(model), "compile_ms": t(comp), "cand_ms": t(mod.forward)}))
"""


def bench_cuda_agent_flow(ext: dict, e2e_p50: float) -> dict:
    info = ext["so"]
    ref = TASK_DIR / "model.py"
    out = {}
    for name, script in (("verify_process_s", _VERIFY), ("profile_process_s", _PROFILE)):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", script, info, str(ref)], capture_output=True, text=True, timeout=300)
        out[name] = time.perf_counter() - t
        if p.returncode != 0:
            raise RuntimeError(f"{name}: {p.stderr[-1500:]}")
    out["build_s"] = ext["p50_s"]
    out["total_s"] = out["build_s"] + out["verify_process_s"] + out["profile_process_s"]
    out["speedup_of_ours"] = out["total_s"] / e2e_p50
    out["ours_evals_per_gpu_hour"] = 3600.0 / e2e_p50
    out["cuda_agent_style_evals_per_gpu_hour"] = 3600.0 / out["total_s"]
    return out


def bench_noise(evs: dict, fmt: str, n: int, batch: int) -> dict:
    """The same honest solution profiled n times (after one warm-up evaluation) under each Evaluator of `evs`
    (name -> Evaluator, e.g. the timing gate on and off), the evaluations alternating between them so drift on
    the host hits all alike. Per name: the CV of the medians of the candidate, eager and torch.compile, and of
    the speed-up over eager."""
    task = load_task(TASK_DIR)
    import dataclasses

    task = dataclasses.replace(task, id=f"elementwise_chain_b{batch}",
                               reference=task.reference.replace("batch_size = 64", f"batch_size = {batch}"))
    files = load_solution(TASK_DIR / fmt / "fast")
    rows = {k: {"cand": [], "eager": [], "comp": [], "speed": [], "gated": [], "profiles": []} for k in evs}
    last = {}
    for i in range(n + 1):
        for name, ev in evs.items():
            r = ev.evaluate(task, files, fmt)
            assert r.ok, r.message
            last[name] = r
            if i == 0:  # the first run of each warms up
                continue
            row = rows[name]
            row["cand"].append(r.timing.candidate.median_ms)
            row["eager"].append(r.timing.eager.median_ms)
            row["comp"].append(r.timing.compiled.median_ms if r.timing.compiled else float("nan"))
            row["speed"].append(r.timing.speedup_eager.point)
            # what moves a profile's figure: its repetitions and the harness costs it was charged against
            row["profiles"].append({"candidate_samples_ms": r.timing.candidate.samples_ms,
                                    "candidate_wall_ms": r.timing.candidate_wall_ms,
                                    "calibration_ms": r.stage_ms.get("calibration"),
                                    "log": [x for x in r.log if x.startswith("profile:")]})
            print(f"noise {name} {i}/{n}: candidate {r.timing.candidate.median_ms:.4f} ms, eager "
                  f"{r.timing.eager.median_ms:.4f} ms, speed-up {r.timing.speedup_eager.point:.3f}", flush=True)
            for line in row["profiles"][-1]["log"]:  # the harness costs it was charged against, and the charges
                if "calibrated before" in line or "fell short" in line:
                    print(f"  {line[:220]}", flush=True)
                elif "calibration (" in line or "candidate time requests" in line:  # the requests' parts
                    print(f"  {line[:600]}", flush=True)

    def cv(xs):
        return statistics.pstdev(xs) / statistics.mean(xs)

    out = {"n": n, "batch_size": batch}
    for name, row in rows.items():
        out[name] = {"candidate_median_ms": row["cand"], "eager_median_ms": row["eager"],
                     "cv_candidate_median": cv(row["cand"]), "cv_eager_median": cv(row["eager"]),
                     "cv_speedup": cv(row["speed"]), "speedup_eager": row["speed"],
                     "cv_compile_median": cv(row["comp"]) if all(c == c for c in row["comp"]) else None,
                     "profiles": row["profiles"], "nvml_last": last[name].nvml,
                     "log_last": [x for x in last[name].log if "profile:" in x][-6:]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--builds", type=int, default=10)
    ap.add_argument("--ext-builds", type=int, default=2)
    ap.add_argument("--evals", type=int, default=10)
    ap.add_argument("--noise-batch", type=int, default=1024)
    ap.add_argument("--noise-n", type=int, default=10, help="profiles per setting in the noise section")
    ap.add_argument("--noise-compare", default="gate_off",
                    choices=("gate_off", "no_gate_flush", "calibration_16", "no_harness_slack", "none"),
                    help="the noise section's second setting beside the defaults: the timing gate off (CUDA only), "
                    "the L2 flush before each call instead of in the gate after its release (timing_gate_flush off, "
                    "CUDA only), "
                    "the harness calibrated at up to 16 calls per request, no timing slack proportional to the "
                    "calibrated harness cost (timing_slack_harness_rel 0 instead of the default), or none")
    ap.add_argument("--sections", default="build,e2e,noise", help="comma-separated: build (cubin + extension "
                    "builds and the CUDA-Agent-style flow), e2e, noise")
    a = ap.parse_args()
    sections = set(a.sections.split(","))
    if not sections <= {"build", "e2e", "noise"}:
        ap.error(f"--sections: unknown {sorted(sections - {'build', 'e2e', 'noise'})}; allowed: build, e2e, noise")
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="bench-cache-")
    cfg = SandboxConfig(backend=a.backend, cache_dir=cache, reps=10, warmup_calls=2, min_rep_ms=1.0)
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "host": os.uname().nodename, "python": sys.version.split()[0]}

    def save() -> None:
        (out_dir / "bench.json").write_text(json.dumps(res, indent=1, default=str))

    with contextlib.ExitStack() as stack:
        ev = stack.enter_context(Evaluator(cfg))
        res["backend"] = ev.backend
        res["isolation"] = ev.isolation_mode
        fmt = "cubin" if ev.backend == "cuda" else "cpu"
        if ev.backend == "cuda":
            import torch

            res["device"] = torch.cuda.get_device_name(0)
            if "build" in sections:
                # the extension builds (slow) run while the cubin builds are measured
                with cf.ThreadPoolExecutor(max_workers=1) as pool:
                    fut = pool.submit(bench_extension_builds, ev, cfg, a.ext_builds)
                    try:
                        res["cubin_build"] = bench_cubin_builds(ev, cfg, a.builds)
                    except Exception as e:  # noqa: BLE001
                        res["cubin_build"] = {"error": f"{type(e).__name__}: {e}"}
                    save()
                    try:
                        res["extension_build"] = fut.result()
                    except Exception as e:  # noqa: BLE001
                        res["extension_build"] = {"error": f"{type(e).__name__}: {e}"}
                save()
            if "e2e" in sections:
                try:
                    res["e2e"] = bench_e2e(ev, fmt, a.evals)
                except Exception as e:  # noqa: BLE001
                    res["e2e"] = {"error": f"{type(e).__name__}: {e}"}
                save()
            if "p50_s" in res.get("extension_build", {}) and "p50_s" in res.get("e2e", {}):
                try:
                    res["cuda_agent_flow"] = bench_cuda_agent_flow(res["extension_build"], res["e2e"]["p50_s"])
                except Exception as e:  # noqa: BLE001
                    res["cuda_agent_flow"] = {"error": f"{type(e).__name__}: {e}"}
                save()
        elif "e2e" in sections:
            res["e2e"] = bench_e2e(ev, fmt, a.evals)
            save()
        if "noise" in sections:
            try:
                evs = {"default": ev}
                if ev.backend == "cuda" and a.noise_compare == "gate_off":  # the same settings without the gate
                    evs["gate_off"] = stack.enter_context(Evaluator(dataclasses.replace(cfg, timing_gate=False)))
                elif ev.backend == "cuda" and a.noise_compare == "no_gate_flush":  # L2 flushed before each call
                    evs["no_gate_flush"] = stack.enter_context(
                        Evaluator(dataclasses.replace(cfg, timing_gate_flush=False)))
                elif a.noise_compare == "calibration_16":  # the harness calibrated at up to 16 calls, not 4
                    evs["calibration_16"] = stack.enter_context(
                        Evaluator(dataclasses.replace(cfg, calibration_calls_max=16)))
                elif a.noise_compare == "no_harness_slack":  # no slack part proportional to the harness cost
                    evs["no_harness_slack"] = stack.enter_context(
                        Evaluator(dataclasses.replace(cfg, timing_slack_harness_rel=0.0)))
                res["noise"] = bench_noise(evs, fmt, a.noise_n, a.noise_batch if res["backend"] == "cuda" else 64)
            except Exception as e:  # noqa: BLE001
                res["noise"] = {"error": f"{type(e).__name__}: {e}"}
            save()
    print(f"== sandbox bench ({res['backend']}, {res.get('device', 'cpu')}, isolation {res['isolation']}) ==")
    cb, eb, e2 = res.get("cubin_build", {}), res.get("extension_build", {}), res.get("e2e", {})
    if "p50_s" in cb:
        print(f"cubin build        p50 {cb['p50_s']:.3f} s  p95 {cb['p95_s']:.3f} s  (n={cb['n']}, {cb['arch']})")
    if "p50_s" in eb:
        print(f"extension build    p50 {eb['p50_s']:.1f} s  max {eb['max_s']:.1f} s  (n={eb['n']}, in parallel)")
    if "p50_s" in e2:
        print(f"e2e evaluation     p50 {e2['p50_s']:.3f} s  p95 {e2['p95_s']:.3f} s  (n={e2['n']}; stages p50 ms: "
              + ", ".join(f"{k} {v:.0f}" for k, v in e2["stage_p50_ms"].items()) + ")")
    ca = res.get("cuda_agent_flow", {})
    if "total_s" in ca:
        print(f"CUDA-Agent flow    {ca['total_s']:.1f} s (build {ca['build_s']:.1f} + verify proc "
              f"{ca['verify_process_s']:.1f} + profile proc {ca['profile_process_s']:.1f}); ours is "
              f"{ca['speedup_of_ours']:.1f}x faster; evals/GPU-hour {ca['ours_evals_per_gpu_hour']:.0f} vs "
              f"{ca['cuda_agent_style_evals_per_gpu_hour']:.0f}")
    nz = res.get("noise", {})
    for name, z in nz.items():  # every setting the section measured, the defaults first
        if isinstance(z, dict) and "cv_candidate_median" in z:
            cc = z["cv_compile_median"]
            ccs = f", compile {cc:.2%}" if cc is not None else ""
            print(f"timing noise {name:8s} CV of the medians: candidate {z['cv_candidate_median']:.2%}, eager "
                  f"{z['cv_eager_median']:.2%}{ccs}, speed-up {z['cv_speedup']:.2%}; candidate median of medians "
                  f"{statistics.median(z['candidate_median_ms']):.4f} ms ({nz['n']} profiles, batch {nz['batch_size']})")
            for line in z.get("log_last") or []:
                if "host time" in line or "gate" in line:
                    print(f"  {name}: {line[:200]}")
    for k in ("cubin_build", "extension_build", "e2e", "cuda_agent_flow", "noise"):
        if isinstance(res.get(k), dict) and "error" in res[k]:
            print(f"{k}: ERROR {res[k]['error'][:300]}")


if __name__ == "__main__":
    main()
