"""Host overhead of one timed candidate call (cpu or cubin format), with the in-process defences on and off, by part.

A trivial cpu-format solution (one `add_one` kernel over a float32 tensor of --numel elements, launched through
`sandbox.runtime` the way the corpus solutions do) is built once; then one child process per side builds a real
`sandbox.candidate.Worker` (monitor on: audit hook, torch wrappers, thread and hook guards; monitor off: none of
them, as `SandboxConfig.runtime_monitor=False`), loads the solution through `Worker.load`, and times, in
microseconds per call (median over --rounds rounds of --iters calls each; best of --repeat children):

  kernel (raw ctypes)     the built function called with ready ctypes arguments: the floor
  launcher                `K.add_one(x, out, n)`: sandbox.runtime's argument checks, launch count, the call
  forward (bare)          `model(x)`: contiguous + empty_like + the launcher, no guard
  guard enter/exit        `with ComputeGuard(...)`: pass (a fresh guard each time, as Worker._call builds one)
  no_grad enter/exit      `with torch.no_grad()`: pass
  guard+no_grad+forward   what Worker._call wraps around forward, without its bookkeeping
  Worker._call            the timed function of a repetition (sandbox.candidate.Worker._call)
  Worker._after_call      the untimed checks right after each timed call (hooks, guard, structure)
  timed region            Timer.run's in-process per-call figure of a `time` request (what the candidate reports)
  time request / call     wall clock of a whole `time` request (decode, calls, checks, copies) / its calls
  audit hook, unruled     `sys.audit` of an event the monitor has no rule for
  audit hook, GUARD_EVENT `sys.audit(GUARD_EVENT, ...)` as a wrapper raises it, from harness code
  integrity, quick        `Worker._integrity(full=False)`: what the serve loop runs before every request
  integrity, full         `Worker._integrity()`: after load / run / sample requests and in every sample (per
                          request, not per call: identities of every harness and torch callable)

A third child (monitor on, plus a counting audit hook) lists the audit events one `Worker._call` raises.
Children are separate processes because an audit hook cannot be removed once added.

    .venv/bin/python benchmarks/overhead_bench.py [--numel 64] [--iters 2000] [--rounds 7] [--repeat 3]
        [--calls 20] [--tree DIR ...] [--json out.json]

--tree (repeatable) runs the children on other checkouts' `sandbox/` (e.g. `git archive` of an earlier revision
into a folder), side by side, for before / after figures in one run; the solution is always built by this
checkout. Children of every tree and side alternate, --repeat times each, and each figure is the best of them:
on a shared host the load moves a single child's figures by 2-4x.

--format cubin (a CUDA host) builds the same kernel as a `__global__` cubin entry point launched on torch's
stream, runs the Worker on cuda:0 with the timing gate (as an evaluation sets it up), and adds the row "timed
call, host part" (the host's time inside each gated call, median: what the gate's host allowance is compared
with); "kernel (raw ctypes)" is not measured there.

Prints a table; record the figures in benchmarks/RESULTS.md (date, machine, load average, command).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = Path(os.environ.get("OVERHEAD_BENCH_TREE") or REPO)  # the sandbox the children import (--tree)

KERNEL = r"""
extern "C" void add_one(const float* x, float* out, long long n) {
    for (long long i = 0; i < n; ++i) out[i] = x[i] + 1.0f;
}
"""
KERNEL_CUBIN = r"""
extern "C" __global__ void add_one(const float* x, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + 1.0f;
}
"""
MODEL_NEW = """import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        K.add_one(x, out, x.numel())
        return out
"""
REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x + 1.0


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
"""

ROWS = ["kernel (raw ctypes)", "launcher", "forward (bare)", "guard enter/exit", "no_grad enter/exit",
        "guard+no_grad+forward", "Worker._call", "Worker._after_call", "timed region", "time request / call",
        "audit hook, unruled", "audit hook, GUARD_EVENT", "integrity, quick", "integrity, full",
        "timed call, host part"]


def build_solution(tmp: Path, fmt: str = "cpu") -> tuple[str, str]:
    """Lay out and build the trivial solution in format fmt ("cpu" or "cubin"); returns (workspace path, manifest
    path)."""
    sys.path.insert(0, str(REPO))
    from sandbox.build import build, detect_arch
    from sandbox.config import SandboxConfig
    from sandbox.workspace import Workspace

    cfg = SandboxConfig(backend="cpu" if fmt == "cpu" else "cuda", cache_dir=str(tmp / "cache"),
                        work_root=str(tmp / "ws"))
    files = ({"model_new.py": MODEL_NEW, "kernels/add_one.cpp": KERNEL} if fmt == "cpu" else
             {"model_new.py": MODEL_NEW.replace("K.add_one(x, out, x.numel())",
                                                "K.add_one(x, out, x.numel(), grid=((x.numel() + 255) // 256,), "
                                                "block=(256,))"),
              "kernels/add_one.cu": KERNEL_CUBIN})
    ws = Workspace.create(tmp / "ws", REFERENCE, files, fmt)
    res = build(ws, fmt, cfg, None, detect_arch(cfg))
    if not res.ok:
        raise SystemExit(f"build failed: {res.log}")
    return str(ws.path), res.manifest_path


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def per_call_us(fn, iters: int, rounds: int) -> float:
    """Median over `rounds` of the mean wall time (µs) of `iters` calls of fn() (garbage collector off)."""
    import gc
    import time

    perf = time.perf_counter
    out = []
    gc.disable()
    try:
        for _ in range(rounds):
            t0 = perf()
            for _ in range(iters):
                fn()
            out.append((perf() - t0) / iters * 1e6)
    finally:
        gc.enable()
    return _median(out)


def _worker(ws: str, manifest: str, monitor: bool, fmt: str = "cpu"):
    """A loaded Worker in this process, set up as sandbox.candidate.serve does (minus the jail); cubin: on cuda:0
    with the timing gate of an evaluation's setup."""
    os.environ["CUDA_AGENT_KERNELS_MANIFEST"] = manifest
    sys.path.insert(0, str(TREE))
    from sandbox import candidate, wire

    candidate.preload(1)
    os.chdir(ws)
    sys.path.insert(0, ws)
    if fmt == "cubin":
        import torch

        from sandbox.config import SandboxConfig
        from sandbox.reference_worker import gate_setup

        torch.cuda.set_device(0)
        cfg = SandboxConfig(backend="cuda", cache_dir=ws + ".cache")
        w = candidate.Worker(ws, "cuda:0", "cubin", cfg.l2_flush_bytes, monitor, None, ws + ".io",
                             gate_setup(cfg, "cuda:0", "cubin"))
    else:
        w = candidate.Worker(ws, "cpu", "cpu", 0, monitor, None, ws + ".io")
    r = w.load({"init_inputs": wire.encode_value([]), "state_dict": wire.encode_value({})})
    if not r.get("ok"):
        raise SystemExit(f"load failed: {r}")
    return w


def child_parts(ws: str, manifest: str, monitor: bool, numel: int, iters: int, rounds: int, calls: int,
                fmt: str = "cpu") -> dict:
    """Every row of ROWS, µs per call, in a fresh Worker with the monitor on or off."""
    import sys as _sys
    import time

    import torch

    from sandbox import wire
    from sandbox.integrity import GUARD_EVENT

    w = _worker(ws, manifest, monitor, fmt)
    cuda = fmt == "cubin"
    dev = "cuda:0" if cuda else "cpu"
    mod = _sys.modules["model_new"]
    kern = mod.K._kernels["add_one"]
    x = torch.randn(numel, device=dev)
    out = torch.empty_like(x)
    launch_kw = {"grid": ((numel + 255) // 256,), "block": (256,)} if cuda else {}
    if cuda:
        raw_call = None
    else:
        from sandbox.runtime import _convert

        vals = _convert(kern.signature, (x, out, numel), "cpu")
        raw = kern._fn

        def raw_call():
            raw(*vals)
    model = w.model
    tables = w.guard_tables
    guard_cls = w.guard_cls

    def guard_only():
        with guard_cls(poison=False, tables=tables):
            pass

    def nograd_only():
        with torch.no_grad():
            pass

    def guarded_forward():
        with guard_cls(poison=False, tables=tables), torch.no_grad():
            model(x)

    state: dict = {}

    def call():
        state["r"] = w._call((x,), False)

    call()

    def after():
        o, _, g = state["r"]
        w._after_call(o, g)

    res = {
        "kernel (raw ctypes)": per_call_us(raw_call, iters, rounds) if raw_call else float("nan"),
        "launcher": per_call_us(lambda: kern(x, out, numel, **launch_kw), iters, rounds),
        "forward (bare)": per_call_us(lambda: model(x), iters, rounds),
        "guard enter/exit": per_call_us(guard_only, iters, rounds),
        "no_grad enter/exit": per_call_us(nograd_only, iters, rounds),
        "guard+no_grad+forward": per_call_us(guarded_forward, iters, rounds),
        "Worker._call": per_call_us(call, iters, rounds),
        "Worker._after_call": per_call_us(after, iters, rounds),
        "audit hook, unruled": per_call_us(lambda: _sys.audit("cuda_agent.bench"), iters, rounds),
        "audit hook, GUARD_EVENT": per_call_us(lambda: _sys.audit(GUARD_EVENT, "bench", "bench", True), iters, rounds),
        "integrity, quick": per_call_us(lambda: w._integrity(full=False), iters, rounds),
        "integrity, full": per_call_us(lambda: w._integrity(), max(iters // 50, 5), rounds),
    }
    sets = wire.encode_value([(torch.randn(numel),) for _ in range(calls)])
    timed, wall, hosts = [], [], []
    for _ in range(max(rounds, 5) * 4):
        t0 = time.perf_counter()
        r = w.time({"input_sets": sets})
        wall.append((time.perf_counter() - t0) / calls * 1e6)
        if not r.get("ok"):
            raise SystemExit(f"time failed: {r}")
        timed.append(r["ms_per_call"] * 1e3)
        w._drop_rep()
        hosts.append(float(r.get("host_ms", 0.0)) * 1e3)
    res["timed region"] = _median(timed)
    res["time request / call"] = _median(wall)
    res["timed call, host part"] = _median(hosts) if cuda else float("nan")
    return res


def child_events(ws: str, manifest: str, numel: int, calls: int, fmt: str = "cpu") -> dict:
    """Audit events raised by `calls` Worker._call calls (monitor on), per call, by event name."""
    import sys as _sys

    import torch

    w = _worker(ws, manifest, True, fmt)
    x = torch.randn(numel, device="cuda:0" if fmt == "cubin" else "cpu")
    w._call((x,), False)  # warm
    counts: dict[str, int] = {}
    on = [False]

    def count(event, args):
        if on[0]:
            counts[event] = counts.get(event, 0) + 1

    _sys.addaudithook(count)
    on[0] = True
    for _ in range(calls):
        w._call((x,), False)
    on[0] = False
    return {k: v / calls for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}


def run_child(args: list[str], tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OVERHEAD_BENCH_TREE=str(tree), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(trees: list[Path], ws: str, manifest: str, common: list[str], repeat: int) -> dict:
    """{tree label: {"off": row -> µs, "on": row -> µs, "events": event -> per call}}: every (tree, side) child run
    `repeat` times, the trees and sides alternating so that load on a shared host hits all alike; each row is the
    minimum over the repeats (of the children's medians)."""
    runs: dict[str, dict[str, list[dict]]] = {t.name: {"off": [], "on": []} for t in trees}
    for _ in range(repeat):
        for t in trees:
            for side in ("off", "on"):
                runs[t.name][side].append(run_child([side, ws, manifest, *common], t))
    out = {}
    for t in trees:
        r = runs[t.name]
        out[t.name] = {side: {row: min(x[row] for x in r[side]) for row in ROWS} for side in ("off", "on")}
        out[t.name]["events"] = run_child(["events", ws, manifest, *common], t)
    return out


def print_tables(res: dict, numel: int, rounds: int, repeat: int, fmt: str = "cpu") -> None:
    from rich.console import Console
    from rich.table import Table

    names = list(res)
    table = Table(title=f"per-call host overhead, {fmt} format, {numel} float32 elements (µs: median of {rounds} "
                        f"rounds, best of {repeat} children)")
    table.add_column("part", justify="right")
    for n in names:
        for col in ("off", "on", "on - off"):
            table.add_column(f"{n}: {col}" if len(names) > 1 else f"monitor {col} µs", justify="right")
    for row in ROWS:
        cells = []
        for n in names:
            off, on = res[n]["off"][row], res[n]["on"][row]
            cells += [f"{off:.2f}", f"{on:.2f}", f"{on - off:+.2f}"]
        table.add_row(row, *cells)
    con = Console(width=max(100, 30 + 36 * len(names)))
    con.print(table)
    ev = Table(title="audit events per Worker._call (monitor on)")
    ev.add_column("event")
    for n in names:
        ev.add_column(n if len(names) > 1 else "per call", justify="right")
    keys = sorted({k for n in names for k in res[n]["events"]})
    for k in keys:
        ev.add_row(k, *[f"{res[n]['events'].get(k, 0):g}" for n in names])
    ev.add_row("total", *[f"{sum(res[n]['events'].values()):g}" for n in names])
    con.print(ev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--numel", type=int, default=64, help="elements of the input (float32)")
    ap.add_argument("--iters", type=int, default=2000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per child (the median is taken)")
    ap.add_argument("--repeat", type=int, default=3, help="children per tree and side (the best is reported)")
    ap.add_argument("--calls", type=int, default=20, help="timed calls per `time` request")
    ap.add_argument("--json", default="", help="also write the figures here")
    ap.add_argument("--format", default="cpu", choices=("cpu", "cubin"), help="cubin: on a CUDA host")
    ap.add_argument("--tree", action="append", default=[],
                    help="checkout whose sandbox/ the children run (repeatable; default: this one)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, ws, manifest = a.child[:3]
        if kind == "events":
            print(json.dumps(child_events(ws, manifest, a.numel, 200, a.format)))
        else:
            print(json.dumps(child_parts(ws, manifest, kind == "on", a.numel, a.iters, a.rounds, a.calls,
                                         a.format)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="overhead-bench-"))
    ws, manifest = build_solution(tmp, a.format)
    common = ["--numel", str(a.numel), "--iters", str(a.iters), "--rounds", str(a.rounds), "--calls", str(a.calls),
              "--format", a.format]
    trees = [Path(t).resolve() for t in (a.tree or [str(REPO)])]
    if len({t.name for t in trees}) != len(trees):
        raise SystemExit("--tree folders need distinct names (they label the columns)")
    res = measure(trees, ws, manifest, common, a.repeat)
    print_tables(res, a.numel, a.rounds, a.repeat, a.format)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
