"""Actor benchmark (issue 9): episodes per hour and where an actor's time goes (sampling / sandbox / idle).

    python benchmarks/actor_bench.py --out OUTDIR --warmup-budget-s 90 --budget-s 120 --total-budget-s 270
                                                    # H200: 0.5B shape, bf16, cubin, local node (fits ~280 s)
    python benchmarks/actor_bench.py --model tiny --backend cpu --fast-sandbox --skill brief --max-turns 4 \
        --think-tokens 32 --concurrent 4 --out OUTDIR             # CPU smoke figures

One actor process with the real agent loop (actors.actor.Actor: concurrent episodes, batched sampler calls,
sandbox calls overlapping sampling) and one sandbox node on the same host (in this process unless --sandbox
names one), with the training reward settings of the node (5 checks, 20 interleaved repetitions,
torch.compile baseline).

The policy is the real JAX sampler on a model of the chosen shape with random weights (no pretrained weights
can be fetched on the GPU host), replaying scripted multi-turn episodes: for each prompt it samples exactly as
many tokens as the scripted reply holds (stop tokens off), then hands the scripted reply to the agent loop with
the sampled log-probs. Sampling therefore costs what a real model writing those replies would cost at those
context lengths, and the sandbox receives real solutions (the corpus's correct and wrong kernels, with a random
comment so that no two episodes share a build or a result). Episodes have up to --max-turns turns (default 8):

    write kernels + compile, verify, profile, write a wrong kernel + verify, write the fast one again + compile,
    verify, profile, finish       (each reply opens with --think-tokens of prose, like a model's reasoning)

The GPU is shared: JAX takes --mem-fraction of its memory; the sampler holds the sandbox's timing lock shared
around each call, so the node's worker times kernels alone (the sampler waits meanwhile; results timed without
the lock are counted as contended).

Phases, each with a hard wall-clock budget (progress lines with timestamps on stdout from the first second; the
JSON in OUT/actor_bench.json is rewritten at every line, so a killed run keeps what it knew):
1. set-up: JAX, the node's workers (starting in the background), tokenizer, model, sampler.
2. warm-up (--warmup-budget-s): the sampler's shapes compiled ahead (`Sampler.precompile` for every prompt
   bucket the scripted episodes reach, one compile line each), while the node evaluates each task's fast solution
   once (its eager and torch.compile baselines, the verify and build paths). Whatever is not done at the budget
   is left to the measured phase (and shows there as compiles / slow first evaluations).
3. measured (--budget-s): one actor runs episodes continuously; at the budget the running episodes are
   cancelled (`Actor.run(abort=...)`) and everything is reported over the window: episodes finished, turns
   sampled, the time split (after --ramp-s, the start where all episodes are in step), node worker busy.
   Episodes/hour is given two ways: finished episodes / window, and turns / window / turns per episode (the
   scripted episodes have a fixed number of turns; this counts the work of episodes the budget cut).
--total-budget-s is a watchdog over everything: when it passes, the stacks of all threads are printed, the JSON
is written with `cut` set, and the process exits 3 (SIGTERM also prints the stacks). Goal (issue 9): neither side
idle more than 30% of the time. The sampler's idle time counts its steps' waits for the GPU's timing lock
(`JaxPolicy.lock_wait_s`: inside a sampler call, but the GPU is the sandbox's then); the table gives both.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import os
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CORPUS = REPO / "tests" / "data" / "corpus"


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start"


def load_corpus(fmt: str, names: Sequence[str] | None) -> dict[str, tuple[Any, dict[str, str], dict[str, str]]]:
    """{task id: (Task, fast solution files, wrong solution files)} for the corpus tasks that have both in `fmt`."""
    from tasks.schema import Task

    out = {}
    for d in sorted(p for p in CORPUS.iterdir() if p.is_dir()):
        if names and d.name not in names:
            continue
        fast, wrong = d / fmt / "fast", d / fmt / "wrong"
        if not (fast.is_dir() and wrong.is_dir() and (d / "task.json").exists()):
            continue
        meta = json.loads((d / "task.json").read_text())
        task = Task(reference=(d / "model.py").read_text(), source="builtin", **meta)
        files = lambda root: {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))  # noqa: E731
                              if p.is_file()}
        out[task.id] = (task, files(fast), files(wrong))
    if not out:
        raise SystemExit(f"no corpus task with {fmt}/fast and {fmt}/wrong solutions under {CORPUS}")
    return out


PROSE = ("I look at the reference and count the passes over memory. Each elementwise op reads and writes the whole "
         "tensor, so fusing them into one kernel saves bandwidth; reductions need a block-level tree and a careful "
         "choice of threads per row. I will keep the launch configuration simple, check the edge cases where the "
         "size is not a multiple of the block, and then measure against eager and torch.compile. ")


class ReplayPolicy:
    """Samples with the real policy exactly as many tokens as each scripted reply holds, then returns the reply
    (see the module doc). inner: an actors.policy.JaxPolicy."""

    def __init__(self, inner: Any, tokenizer: Any, corpus: dict, max_turns: int, think_tokens: int, seed: int = 0):
        from learner.chat import ChatFormat

        self.inner = inner
        self.version = inner.version
        self.name = f"replay:{inner.name}"
        self.tok = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.corpus = corpus
        self.max_turns = max_turns
        self.rng = random.Random(seed)
        prose_ids = tokenizer.encode(PROSE * (1 + think_tokens // 40))
        self.prose = tokenizer.decode(prose_ids[:think_tokens]) if think_tokens else ""
        self.sampled_tokens = 0
        self.turns = 0
        self.calls = 0
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.new_shapes: list = []

    def _files(self, files: dict[str, str]) -> str:
        from learner.chat import format_tool_call

        calls = []
        for path, text in files.items():
            if path.startswith("kernels/"):
                text = f"// variant {self.rng.getrandbits(64):016x}\n" + text  # no shared builds or results
            calls.append(format_tool_call("write_file", {"path": path, "content": text}))
        return "\n".join(calls)

    def reply(self, task_id: str, turn: int) -> str:
        from learner.chat import format_tool_call as call

        _, fast, wrong = self.corpus[task_id]
        plan = [self._files(fast) + "\n" + call("compile", {}), call("verify", {}), call("profile", {}),
                self._files({k: v for k, v in wrong.items() if k.startswith("kernels/")}) + "\n" + call("verify", {}),
                self._files({k: v for k, v in fast.items() if k.startswith("kernels/")}) + "\n" + call("compile", {}),
                call("verify", {}), call("profile", {})]
        plan = plan[:max(0, self.max_turns - 1)] + [call("finish", {})]
        return (self.prose + "\n" if self.prose else "") + plan[min(turn, len(plan) - 1)]

    def generate(self, prompts: Sequence[Sequence[int]], settings: Sequence[Any]) -> list[Any]:
        import dataclasses

        from actors.sampler import Completion

        replies = []
        for prompt in prompts:
            msgs = self.chat.parse(prompt)
            user = next(m.content for m in msgs if m.role == "user")
            task_id = re.match(r"Task (\S+):", user).group(1)
            turn = sum(m.role == "assistant" for m in msgs)
            replies.append(self.tok.encode(self.reply(task_id, turn)) + [self.tok.im_end_id])
        params = [dataclasses.replace(sp, max_new_tokens=min(len(r), sp.max_new_tokens), stop_token_ids=(),
                                      stop_strings=()) for r, sp in zip(replies, settings)]
        sampled = self.inner.generate(prompts, params)
        st = getattr(getattr(self.inner, "sampler", None), "last_stats", {}) or {}
        self.prefill_s += float(st.get("prefill_s", 0.0))
        self.decode_s += float(st.get("decode_s", 0.0))
        self.new_shapes += list(st.get("new_shapes", []))
        self.calls += 1
        self.turns += len(prompts)
        out = []
        for ids, sp, s in zip(replies, settings, sampled):
            n = min(len(ids), sp.max_new_tokens)
            self.sampled_tokens += len(s.tokens)
            out.append(Completion(ids[:n], s.logprobs[:n], "stop_token" if n == len(ids) else "length"))
        return out


def build_tokenizer(corpus: dict) -> Any:
    from actors.skill import system_prompt
    from learner.tokenizer import train_bpe

    texts = [system_prompt(f, m, 8, skill) for f in ("cpu", "cubin", "extension") for m in ("multi_turn", "single_turn")
             for skill in ("full", "brief")]
    for task, fast, wrong in corpus.values():
        texts += [task.reference, *fast.values(), *wrong.values()]
    return train_bpe(texts * 4 + [PROSE] * 16, vocab_size=4096)


def node_status(client: Any) -> dict[str, Any]:
    """Summed cumulative worker busy seconds, worker count and seconds per job stage (the node's `stage_s`:
    timing_lock_held is the jobs' exclusive hold of the GPU's timing lock, profile_timed the profile's timed
    requests) over the live nodes."""
    busy, workers = 0.0, 0
    stage_s: dict[str, float] = {}
    for n in client.nodes().values():
        st = n.get("status") or {}
        for k, v in (st.get("stage_s") or {}).items():
            stage_s[k] = stage_s.get(k, 0.0) + float(v)
        busy += float(st.get("worker_busy_s", 0.0))
        workers += int(st.get("workers", 0))
    return {"worker_busy_s": busy, "workers": workers, "stage_s": stage_s}


def expected_prompt_lengths(chat: Any, corpus: dict, policy: "ReplayPolicy", fmt: str, max_turns: int, skill: str,
                            observation_tokens: int = 160) -> list[int]:
    """Context lengths (tokens) the scripted episodes' sampler calls will have, per task and turn, with each tool
    observation taken as `observation_tokens` (what `Sampler.precompile` should compile ahead)."""
    from actors.skill import system_prompt, task_prompt
    from learner.chat import ChatTokens, Message

    out = []
    for tid, (task, _, _) in corpus.items():
        rec = ChatTokens(chat, [Message("system", system_prompt(fmt, "multi_turn", max_turns, skill)),
                                Message("user", task_prompt(task, fmt, "multi_turn"))])
        n = len(rec.context())
        for turn in range(max_turns):
            out.append(n)
            n += len(chat.tokenizer.encode(policy.reply(tid, turn))) + 1 + observation_tokens
    return out


class Progress:
    """Timestamped progress lines on stdout; each also rewrites the JSON (what is known so far) on disk."""

    def __init__(self, path: Path, results: dict, t_start: float):
        self.path, self.results, self.t_start = path, results, t_start
        self.lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t_start

    def __call__(self, msg: str, final: bool = False) -> None:
        with self.lock:
            print(f"[{self.now():7.1f} s] {msg}", flush=True)
            self.write(final)

    def write(self, final: bool = False) -> None:
        for _ in range(3):  # another thread may be adding a key: try again
            try:
                text = json.dumps(self.results | {"partial": not final, "elapsed_s": round(self.now(), 1)}, indent=2,
                                  default=str)
                break
            except RuntimeError:
                time.sleep(0.01)
        else:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.path)


class CompileLog:
    """JAX backend compilations seen in this process (jax.monitoring), by function; a line for each slow one."""

    EVENT = "/jax/core/compile/backend_compile_duration"
    SAMPLER = ("jit(_prefill)", "jit(_start)", "jit(_decode_chunk)")

    def __init__(self, note: Any, min_note_s: float = 1.0):
        self.note, self.min_note_s = note, min_note_s
        self.count: collections.Counter = collections.Counter()
        self.secs: collections.Counter = collections.Counter()
        self.phase = "setup"
        self.by_phase: collections.Counter = collections.Counter()

    def install(self) -> None:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event: str, duration: float, **kw: Any) -> None:
        if event != self.EVENT and "backend_compile" not in event:
            return
        name = str(kw.get("fun_name", "?"))
        self.count[name] += 1
        self.secs[name] += duration
        self.by_phase[self.phase] += 1
        if duration >= self.min_note_s or (self.phase == "measured" and name.startswith(self.SAMPLER)):
            self.note(f"compiled {name} in {duration:.1f} s (compile {sum(self.count.values())}, phase {self.phase})")

    def summary(self) -> dict:
        return {"compiles": sum(self.count.values()), "compile_s": round(sum(self.secs.values()), 2),
                "by_phase": dict(self.by_phase),
                "by_function": {k: {"n": v, "s": round(self.secs[k], 2)} for k, v in self.count.most_common()}}


def warm_sandbox(client: Any, corpus: dict, fmt: str, stages: Any, deadline: float, note: Any) -> dict:
    """One full evaluation of each task's fast solution (eager + torch.compile baselines), one verify and one
    build-only job (the node's other evaluator and its build path), all submitted at once; waits until `deadline`
    at the latest. Returns {"done": n, "submitted": n, "by_status": {...}}."""
    import uuid

    from protocol.sandbox_jobs import SandboxJob

    jobs = []
    for i, (tid, (task, fast, _)) in enumerate(corpus.items()):
        files = {k: (f"// warm-up {uuid.uuid4().hex}\n" + v if k.startswith("kernels/") else v) for k, v in fast.items()}
        kinds = [("final", stages.final_settings)]
        if i == 0:
            kinds += [("verify", stages.verify_settings), ("compile", stages.compile_settings)]
        for kind, settings in kinds:
            job = SandboxJob(job_id=f"warmup-{tid}-{kind}-{uuid.uuid4().hex[:8]}", task=task.to_dict(), files=files,
                             format=fmt, settings=dict(settings), priority=0, deadline_s=600.0)
            jobs.append((tid, kind, time.monotonic(), client.submit(job)))
    statuses: collections.Counter = collections.Counter()
    pending = list(jobs)
    while pending and time.monotonic() < deadline:
        for item in list(pending):
            tid, kind, t0, fut = item
            if not fut.done():
                continue
            pending.remove(item)
            try:
                res = fut.result().result
                status = str(res.get("status"))
                extra = f"reward {res.get('reward')}" if kind == "final" else ""
            except Exception as e:  # noqa: BLE001 - reported, the bench goes on
                status, extra = f"error {type(e).__name__}", str(e)[:120]
            statuses[f"{kind}:{status}"] += 1
            note(f"warm-up sandbox {kind} {tid}: {status} {extra} ({time.monotonic() - t0:.1f} s after submit)")
        time.sleep(0.1)
    return {"submitted": len(jobs), "done": len(jobs) - len(pending), "by_status": dict(statuses),
            "not_done": [f"{k}:{t}" for t, k, _, _ in pending]}


def window_figures(a: dict, b: dict, workers: int) -> dict:
    """Figures over the window between two snapshots (see `snapshot` in main)."""
    wall = max(b["clock"]["wall_s"] - a["clock"]["wall_s"], 1e-9)
    d = {k: b["clock"][k] - a["clock"][k] for k in ("sampling_s", "sandbox_s", "both_s", "idle_s")}
    calls = b["sampler_calls"] - a["sampler_calls"]
    turns = b["turns"] - a["turns"]
    episodes = b["episodes"] - a["episodes"]
    node_stage_s = {k: v - (a.get("stage_s") or {}).get(k, 0.0) for k, v in (b.get("stage_s") or {}).items()}
    return {"wall_s": wall, "episodes": episodes, "episodes_per_hour": episodes / wall * 3600, "turns": turns,
            "sampling_busy": d["sampling_s"] / wall, "sandbox_busy": d["sandbox_s"] / wall, "both": d["both_s"] / wall,
            "idle": d["idle_s"] / wall,
            "node_worker_busy": (b["worker_busy_s"] - a["worker_busy_s"]) / wall / max(1, workers),
            # jobs that finished in the window: seconds per stage (timing_lock_held: their exclusive hold of the
            # timing lock; profile_timed: the part of it in timed requests, the rest is the harness's host work)
            "node_stage_s": node_stage_s,
            "sampler_calls": calls, "mean_batch": turns / max(1, calls),
            "sampled_tokens_per_s": (b["tokens"] - a["tokens"]) / wall,
            "prefill_s": b["prefill_s"] - a["prefill_s"], "decode_s": b["decode_s"] - a["decode_s"],
            # a sampler step waiting for the GPU's timing lock is inside a call but idle: counted apart
            "sampler_lock_wait_s": b.get("lock_wait_s", 0.0) - a.get("lock_wait_s", 0.0),
            "sampler_idle_with_lock_waits": 1 - (d["sampling_s"] - (b.get("lock_wait_s", 0.0)
                                                                    - a.get("lock_wait_s", 0.0))) / wall,
            "sandbox_calls": {k: b["sandbox_calls"].get(k, 0) - a["sandbox_calls"].get(k, 0) for k in b["sandbox_calls"]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", choices=("0.5b", "tiny"), default="0.5b")
    ap.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--sandbox", default="", help="existing node endpoints (comma-separated); default: a local node")
    ap.add_argument("--workers", type=int, default=0, help="local node's verify/profile workers (0 = node default)")
    ap.add_argument("--node-gpus", default="", help="local node's GPUs (CUDA_VISIBLE_DEVICES entries, comma-separated;"
                    " default: every visible one). With --sampler-gpus, the sampler and the node get GPUs of their own"
                    " (their timing-lock keys then differ, so neither waits for the other)")
    ap.add_argument("--sampler-gpus", default="", help="CUDA_VISIBLE_DEVICES of this process (the JAX sampler), set "
                    "before JAX starts; default: inherited")
    ap.add_argument("--episodes", type=int, default=1000, help="most measured episodes (the budget ends it first)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="measured phase, hard: running episodes are "
                                                                  "cancelled at its end")
    ap.add_argument("--ramp-s", type=float, default=-1.0, help="start of the measured phase left out of the window "
                                                               "(-1 = min(30, budget / 5))")
    ap.add_argument("--warmup-budget-s", type=float, default=150.0, help="warm-up (precompile + sandbox), hard")
    ap.add_argument("--total-budget-s", type=float, default=0.0, help="watchdog over the whole run (0 = set-up "
                                                                      "allowance of 120 s + warm-up + measured + 30)")
    ap.add_argument("--min-prompt-bucket", type=int, default=0, help="sampler's smallest prompt bucket (0 = 4096 on "
                                                                      "a GPU, 256 on CPU: few shapes to compile)")
    ap.add_argument("--no-precompile", action="store_true", help="compile sampler shapes on first use instead")
    ap.add_argument("--jax-cache-dir", default="", help="JAX persistent compilation cache (a second run on the same "
                                                        "machine skips the compiles)")
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--think-tokens", type=int, default=256)
    ap.add_argument("--skill", choices=("full", "brief"), default="full", help="system prompt (brief: CPU smoke)")
    ap.add_argument("--mem-fraction", type=float, default=0.45, help="JAX's share of GPU memory")
    ap.add_argument("--tasks", default="", help="corpus task names (comma-separated); default: all")
    ap.add_argument("--fast-sandbox", action="store_true", help="cheap node settings (2 checks, 5 reps, no "
                                                                  "torch.compile): CPU smoke runs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    total_budget = args.total_budget_s or (120.0 + args.warmup_budget_s + args.budget_s + 30.0)
    ramp = args.ramp_s if args.ramp_s >= 0 else min(30.0, args.budget_s / 5)
    results: dict[str, Any] = {"machine": _machine(), "args": vars(args) | {"out": str(args.out)},
                               "total_budget_s": total_budget, "ramp_s": ramp, "timeline": {}}
    note = Progress(args.out / "actor_bench.json", results, t_start)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)  # a killed run says where it was

    finished_ok = threading.Event()  # the final JSON is written: the watchdog only ends a slow shutdown

    def watchdog() -> None:
        time.sleep(max(0.0, total_budget - note.now()))
        if finished_ok.is_set():
            print(f"[{note.now():7.1f} s] total budget reached during the node's shutdown; the JSON is complete; "
                  "exiting 0", flush=True)
            os._exit(0)
        results["cut"] = f"total budget {total_budget:.0f} s reached"
        note(f"{results['cut']}: thread stacks on stderr; the JSON holds what finished; exiting 3")
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    threading.Thread(target=watchdog, name="watchdog", daemon=True).start()
    note(f"start: {results['machine']}; budgets: warm-up {args.warmup_budget_s:.0f} s, measured {args.budget_s:.0f} s "
         f"(ramp {ramp:.0f} s), total {total_budget:.0f} s")

    if args.sampler_gpus:  # before JAX (and torch) start: the node's workers set their own per worker
        os.environ["CUDA_VISIBLE_DEVICES"] = args.sampler_gpus
    results.update(node_gpus=args.node_gpus or "all visible", sampler_gpus=args.sampler_gpus or "inherited")
    from actors.sampler import configure_device_memory

    configure_device_memory(args.mem_fraction)
    import jax

    if args.jax_cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.jax_cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    compiles = CompileLog(note)
    compiles.install()
    results["compiles"] = compiles.count  # live view in every partial JSON

    from actors.activity import ActivityClock
    from actors.actor import Actor, cycle_tasks, run_actor
    from actors.config import ActorConfig, AgentConfig, StagesConfig
    from actors.policy import JaxPolicy, sampler_timing_lock
    from actors.sampler import Sampler, length_bucket
    from actors.sandbox_stages import SandboxStages
    from actors.weights import PolicyVersions, model_from_tensors, random_policy_tensors
    from learner.chat import ChatFormat
    from learner.model import ModelConfig
    from sandbox.client import SandboxClient
    from sandbox.config import SandboxConfig

    on_gpu = jax.default_backend() == "gpu"
    results.update(jax_version=jax.__version__, jax_backend=jax.default_backend(), devices=[str(d) for d in jax.devices()])
    note(f"jax {jax.__version__} on {jax.default_backend()}: {results['devices']}")
    backend = args.backend if args.backend != "auto" else ("cuda" if on_gpu else "cpu")  # no torch in this process
    fmt = "cubin" if backend == "cuda" else "cpu"
    results["format"] = fmt
    node = None
    if args.sandbox:
        endpoints = [e for e in args.sandbox.split(",") if e]
    else:
        from sandbox.service import SandboxNode, ServiceConfig

        sb = SandboxConfig(backend=backend)
        if args.fast_sandbox:
            sb = SandboxConfig(backend=backend, num_trials=2, reps=5, use_compile=False, bootstrap_samples=500)
        node = SandboxNode(ServiceConfig(endpoint="tcp://127.0.0.1:0", node_id="bench-node", workers=args.workers,
                                         gpus=args.node_gpus, metrics_port=-1, sandbox=sb)).start()
        endpoints = [node.endpoint]
        note(f"sandbox node started at {node.endpoint} ({node.n_workers} worker(s) coming up in the background)")
    corpus = load_corpus(fmt, [t for t in args.tasks.split(",") if t] or None)
    tok = build_tokenizer(corpus)
    chat = ChatFormat(tok)
    note(f"corpus {len(corpus)} tasks ({', '.join(corpus)}), tokenizer {tok.vocab_size} tokens")
    if args.model == "tiny":
        mcfg = ModelConfig.tiny(vocab_size=tok.vocab_size)
    else:
        mcfg = ModelConfig.qwen2_5_0_5b(param_dtype="bfloat16" if on_gpu else "float32",
                                        dtype="bfloat16" if on_gpu else "float32",
                                        attention_impl="cudnn" if on_gpu else "xla")
    results.update(model=args.model, model_params=mcfg.num_params())
    t0 = time.monotonic()
    tensors = random_policy_tensors(mcfg, seed=args.seed, std=0.02)
    note(f"random weights drawn: {mcfg.num_params() / 1e6:.1f}M params in {time.monotonic() - t0:.1f} s")
    model = model_from_tensors(mcfg, tensors)
    del tensors
    agent = AgentConfig(max_turns=args.max_turns, max_context_tokens=32768, max_new_tokens_per_turn=4096,
                        solution_format=fmt, temperature=1.0, skill=args.skill)
    cfg = ActorConfig(actor_id="bench-actor", concurrent_episodes=args.concurrent, max_batch=64, agent=agent,
                      stages=StagesConfig(), max_cache_len=32768,
                      sampler_min_batch_bucket=1 << max(0, (args.concurrent - 1).bit_length()),
                      sampler_min_prompt_bucket=args.min_prompt_bucket or (4096 if on_gpu else 256))
    scfg = cfg.sampler_config()
    sampler = Sampler(model, scfg, detokenize=tok.decode)
    jax.block_until_ready(sampler.params)
    inner = JaxPolicy(sampler, version=1, seed=args.seed, timing_lock=sampler_timing_lock("auto"))
    policy = ReplayPolicy(inner, tok, corpus, args.max_turns, args.think_tokens, seed=args.seed)
    results["timeline"]["setup_s"] = round(note.now(), 1)
    note(f"model and sampler on the device in {time.monotonic() - t0:.1f} s; sampler buckets: batch "
         f"{scfg.min_batch_bucket}, prompt >= {scfg.min_prompt_bucket}, cache >= {scfg.min_cache_bucket}, "
         f"headroom {scfg.cache_headroom}")

    tasks = [task for task, _, _ in corpus.values()]
    client = SandboxClient(endpoints, client_id="bench-actor")
    try:
        # ---------------------------------------------------------------- warm-up (hard budget)
        compiles.phase = "warm-up"
        t_w = time.monotonic()
        w_deadline = t_w + args.warmup_budget_s
        lens = expected_prompt_lengths(chat, corpus, policy, fmt, args.max_turns, args.skill)
        buckets = [length_bucket(min(lens), scfg.min_prompt_bucket)]  # every bucket from the first prompt to the
        while buckets[-1] < int(max(lens) * 1.15):                          # longest context expected, plus 15%
            buckets.append(length_bucket(buckets[-1] + 1, scfg.min_prompt_bucket))
        results["warmup"] = {"expected_context_tokens": [min(lens), max(lens)], "prompt_buckets": buckets}
        note(f"warm-up, budget {args.warmup_budget_s:.0f} s: contexts expected {min(lens)}-{max(lens)} tokens -> "
             f"prompt buckets {buckets}; the node warms up in parallel")
        sb_out: dict = {}
        stages_cfg = cfg.stages

        def sandbox_warmup() -> None:
            if node is not None:
                while not node.wait_ready(1.0):
                    if time.monotonic() > w_deadline:
                        sb_out["ready"] = False
                        note("warm-up: the node's workers were not up at the warm-up budget")
                        return
                note(f"sandbox node ready ({node.n_workers} worker(s)); warm-up evaluations submitted")
            sb_out["ready"] = True
            sb_out.update(warm_sandbox(client, corpus, fmt, stages_cfg, w_deadline, note))

        sb_thread = threading.Thread(target=sandbox_warmup, name="sandbox-warmup", daemon=True)
        sb_thread.start()
        pre = []
        if not args.no_precompile:
            last_s = 0.0
            for p in buckets:  # a shape cannot be cut half-way: the next one starts only if it fits, by the last
                t_p = time.monotonic()
                if t_p + last_s > w_deadline:
                    note(f"warm-up budget: prompt bucket {p} and up left to the measured phase (the last shape took "
                         f"{last_s:.0f} s)")
                    break
                sampler.precompile(scfg.min_batch_bucket, [p], max_new_tokens=agent.max_new_tokens_per_turn,
                                   on_done=lambda key, s: (pre.append([*key, round(s, 1)]),
                                                           note(f"precompiled sampler shape (batch, prompt, cache) "
                                                                f"{key} in {s:.1f} s")))
                last_s = time.monotonic() - t_p
        sb_thread.join(max(0.0, w_deadline - time.monotonic()))
        results["warmup"].update(precompiled=pre, sandbox=dict(sb_out), elapsed_s=round(time.monotonic() - t_w, 1))
        results["timeline"]["warmup_end_s"] = round(note.now(), 1)
        note(f"warm-up done in {results['warmup']['elapsed_s']:.0f} s: {len(pre)} sampler shapes, sandbox "
             f"{sb_out.get('done', 0)}/{sb_out.get('submitted', '?')} jobs")
        if node is not None and not node.wait_ready(0):
            note("the node's workers are still not up: the measured phase waits for them inside its budget")

        # ---------------------------------------------------------------- measured phase (hard budget)
        compiles.phase = "measured"
        clock = ActivityClock()
        stages = SandboxStages(client, cfg.stages, clock)
        finished: list = []
        sink_lock = threading.Lock()

        class Sink:
            def put(self, ep):
                if ep.trainable:
                    ep.trajectory(cfg.actor_id)  # what the actor would ship (its cost included)
                with sink_lock:
                    finished.append(ep)

        done_count = [0]

        def on_episode(ep):
            done_count[0] += 1
            note(f"episode {done_count[0]} done: {ep.task.id} {ep.status}, reward {ep.reward:g}, "
                 f"{ep.stats['turns']} turns, {ep.stats['context_tokens']} tokens, {ep.stats['wall_s']:.0f} s")

        actor = Actor(cfg, chat, stages, PolicyVersions(policy), Sink(), fmt, clock=clock, on_episode=on_episode)

        def snapshot() -> dict:
            with sink_lock:
                n_eps = len(finished)
            return {"clock": clock.snapshot(), "episodes": n_eps, "turns": policy.turns, "tokens": policy.sampled_tokens,
                    "sampler_calls": policy.calls, "prefill_s": policy.prefill_s, "decode_s": policy.decode_s,
                    "lock_wait_s": getattr(inner, "lock_wait_s", 0.0),
                    "sandbox_calls": dict(stages.calls), **node_status(client)}

        snaps: dict = {}
        stop, abort = threading.Event(), threading.Event()
        t_m = time.monotonic()

        def measure() -> None:
            snaps["start"] = snapshot()
            if ramp > 0 and not abort.wait(ramp):
                snaps["ramp"] = snapshot()
                note(f"ramp over: window starts ({snaps['ramp']['turns']} turns, {snaps['ramp']['episodes']} episodes "
                     f"so far)")
            last = time.monotonic()
            while not abort.wait(1.0):
                if time.monotonic() - t_m >= args.budget_s:
                    break
                if time.monotonic() - last >= 15:
                    last = time.monotonic()
                    s = snapshot()
                    note(f"measuring: {s['episodes']} episodes, {s['turns']} turns, {s['sampler_calls']} sampler calls,"
                         f" sandbox calls {s['sandbox_calls']}")
            snaps["end"] = snapshot()
            stop.set()
            abort.set()

        note(f"measured phase, budget {args.budget_s:.0f} s: {args.concurrent} concurrent episodes")
        m_thread = threading.Thread(target=measure, name="measure", daemon=True)
        m_thread.start()
        summary = run_actor(actor, cycle_tasks(tasks, args.seed), max_episodes=args.episodes, stop=stop, abort=abort)
        abort.set()
        m_thread.join(5)
        snaps.setdefault("end", snapshot())
        workers = max(1, int(snaps["end"]["workers"]))
        whole = window_figures(snaps["start"], snaps["end"], workers)
        window = window_figures(snaps.get("ramp", snaps["start"]), snaps["end"], workers)
        eps = list(finished)
        turns_per_episode = (sum(e.stats["turns"] for e in eps) / len(eps)) if eps else float(args.max_turns)
        for w in (whole, window):
            w["episodes_per_hour_from_turns"] = w["turns"] / turns_per_episode / w["wall_s"] * 3600
        results["measured"] = {
            "window": window, "whole": whole, "turns_per_episode": turns_per_episode,
            "episodes_aborted": summary.get("episodes_aborted", 0), "episodes_finished": len(eps),
            "by_status": summary["by_status"], "mean_reward": summary["mean_reward"],
            "final_status": dict(collections.Counter(e.final.status for e in eps if e.final is not None)),
            "contended_finals": sum(1 for e in eps if e.final is not None and e.final.contended),
            "sampler_lock_waits": getattr(inner, "lock_waits", 0),
            "sampler_lock_wait_s": round(getattr(inner, "lock_wait_s", 0.0), 2), "max_batch": summary["batcher"]["max_batch_seen"],
            "context_tokens_max": max((e.stats["context_tokens"] for e in eps), default=0),
            "new_sampler_shapes": [list(k) for k in policy.new_shapes],
        }
        results["timeline"]["measured_end_s"] = round(note.now(), 1)
        results["compiles"] = compiles.summary()
        note(f"measured phase done: {len(eps)} episodes finished, {results['measured']['episodes_aborted']} cut by the "
             f"budget, {whole['turns']} turns in {whole['wall_s']:.0f} s", final=True)
        finished_ok.set()
    finally:
        client.close()
    _table(results, args)
    sys.stdout.flush()
    if node is not None:  # after the JSON and the table: a slow shutdown costs no figure
        node.drain(5)
        node.close()
    return 0


def _table(results: dict, args: Any) -> None:
    m = results["measured"]
    w = m["window"]
    ns = w.get("node_stage_s", {})
    print(f"\nactor bench: {results['machine']}; jax {results['jax_backend']}; {args.model} "
          f"({results['model_params'] / 1e6:.1f}M params); format {results['format']}; {args.concurrent} concurrent, "
          f"up to {args.max_turns} turns")
    c = results["compiles"]
    rows = [("window (after the ramp)", f"{w['wall_s']:.0f} s: {w['episodes']} episodes finished, {w['turns']} turns"),
            ("episodes / hour (finished)", f"{w['episodes_per_hour']:.0f}"),
            ("episodes / hour (from turns)", f"{w['episodes_per_hour_from_turns']:.0f} ({m['turns_per_episode']:.1f} "
                                             "turns per episode)"),
            ("sampling busy", f"{w['sampling_busy']:.0%} in a call, {w['sampler_lock_wait_s']:.0f} s of it waiting for "
                              f"the timing lock: sampler idle {w['sampler_idle_with_lock_waits']:.0%} with the waits, "
                              f"{1 - w['sampling_busy']:.0%} without"),
            ("sandbox busy", f"{w['sandbox_busy']:.0%} (sandbox idle {1 - w['sandbox_busy']:.0%})"),
            ("both / neither", f"{w['both']:.0%} / {w['idle']:.0%}"),
            ("node worker busy", f"{w['node_worker_busy']:.0%}"),
            ("node timing lock held exclusively", f"{ns.get('timing_lock_held', 0.0):.0f} s of the window "
                                                  f"({ns.get('profile_timed', 0.0):.0f} s in timed requests, "
                                                  f"{ns.get('calibration', 0.0):.0f} s calibrating)"),
            ("sampler calls, mean / max batch", f"{w['sampler_calls']}, {w['mean_batch']:.1f} / {m['max_batch']}"),
            ("sampled tokens / s", f"{w['sampled_tokens_per_s']:.0f} (prefill {w['prefill_s']:.0f} s, decode "
                                   f"{w['decode_s']:.0f} s)"),
            ("sandbox calls", json.dumps(w["sandbox_calls"])), ("final statuses", json.dumps(m["final_status"])),
            ("episodes cut by the budget", str(m["episodes_aborted"])),
            ("contended finals / sampler lock waits", f"{m['contended_finals']} / {m['sampler_lock_waits']} "
                                                      f"({m.get('sampler_lock_wait_s', 0.0):.0f} s waited, whole run; "
                                                      "inside sampling busy)"),
            ("compiles (setup / warm-up / measured)", f"{c['compiles']} in {c['compile_s']:.0f} s "
                                                      f"{json.dumps(c['by_phase'])}"),
            ("timeline", json.dumps(results["timeline"]))]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


if __name__ == "__main__":
    sys.exit(main())
