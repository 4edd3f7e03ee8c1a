"""Actor benchmark (issue 9): episodes per hour and where an actor's time goes (sampling / sandbox / idle).

    python benchmarks/actor_bench.py --out OUTDIR      # H200: 0.5B shape, bf16, cubin, local node (~9 min)
    python benchmarks/actor_bench.py --model tiny --backend cpu --fast-sandbox --skill brief --max-turns 4 \
        --think-tokens 32 --concurrent 4 --episodes 8 --out OUTDIR             # CPU smoke figures

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

Reported for the measured phase (after warm-up episodes, one per task by default, that compile the sampler's
shapes and the torch.compile baselines; the measured phase starts episodes for --budget-s, then lets the
running ones finish, and its wall clock includes that tail): episodes/hour, sampling busy, sandbox busy (at least one job of this actor in flight), both, idle
(neither), the node's worker busy fraction, sampler calls and batch sizes, sampled tokens/s, sandbox calls per
stage, episode statuses and rewards. Goal (issue 9): neither side idle more than 30% of the time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
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


def node_status(client: Any) -> dict[str, float]:
    """Summed cumulative worker busy seconds and worker count over the live nodes."""
    busy, workers = 0.0, 0
    for n in client.nodes().values():
        st = n.get("status") or {}
        busy += float(st.get("worker_busy_s", 0.0))
        workers += int(st.get("workers", 0))
    return {"worker_busy_s": busy, "workers": workers}


def run_phase(args: Any, cfg: Any, chat: Any, client: Any, policy: Any, fmt: str, tasks: list, episodes: int,
              budget_s: float) -> dict:
    """Run up to `episodes` episodes; after `budget_s` no new episode starts (the running ones finish)."""
    from actors.activity import ActivityClock
    from actors.actor import Actor, run_actor
    from actors.sandbox_stages import SandboxStages
    from actors.weights import PolicyVersions

    class Sink:
        def __init__(self):
            self.episodes = []

        def put(self, ep):
            if ep.trainable:
                ep.trajectory(cfg.actor_id)  # what the actor would ship (its cost included)
            self.episodes.append(ep)

    sink = Sink()
    clock = ActivityClock()
    actor = Actor(cfg, chat, SandboxStages(client, cfg.stages, clock), PolicyVersions(policy), sink, fmt, clock=clock)
    before = node_status(client)
    tokens0 = policy.sampled_tokens
    order = [tasks[i % len(tasks)] for i in range(episodes)]
    stop = threading.Event()
    timer = threading.Timer(budget_s, stop.set)
    timer.start()
    try:
        summary = run_actor(actor, order, stop=stop)
    finally:
        timer.cancel()
    after = node_status(client)
    t = summary["time"]
    wall = max(t["wall_s"], 1e-9)
    eps = sink.episodes
    contended = sum(1 for e in eps if e.final is not None and e.final.contended)
    return {
        "episodes": len(eps), "wall_s": wall, "episodes_per_hour": len(eps) / wall * 3600,
        "sampling_busy": t["sampling_s"] / wall, "sandbox_busy": t["sandbox_s"] / wall, "both": t["both_s"] / wall,
        "idle": t["idle_s"] / wall,
        "node_worker_busy": (after["worker_busy_s"] - before["worker_busy_s"]) / wall / max(1, after["workers"]),
        "sampler_calls": summary["batcher"]["calls"], "sequences": summary["batcher"]["sequences"],
        "mean_batch": summary["batcher"]["sequences"] / max(1, summary["batcher"]["calls"]),
        "max_batch": summary["batcher"]["max_batch_seen"],
        "sampled_tokens_per_s": (policy.sampled_tokens - tokens0) / wall,
        "sandbox_calls": summary["sandbox_calls"], "by_status": summary["by_status"],
        "mean_reward": summary["mean_reward"], "turns_mean": sum(e.stats["turns"] for e in eps) / max(1, len(eps)),
        "final_status": {s: sum(1 for e in eps if e.final is not None and e.final.status == s)
                         for s in sorted({e.final.status for e in eps if e.final is not None})},
        "contended_finals": contended, "sampler_lock_waits": getattr(policy.inner, "lock_waits", 0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", choices=("0.5b", "tiny"), default="0.5b")
    ap.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--sandbox", default="", help="existing node endpoints (comma-separated); default: a local node")
    ap.add_argument("--workers", type=int, default=0, help="local node's verify/profile workers (0 = node default)")
    ap.add_argument("--episodes", type=int, default=1000, help="most measured episodes (the budget ends it first)")
    ap.add_argument("--budget-s", type=float, default=360.0, help="measured phase: no episode starts after this")
    ap.add_argument("--warmup-episodes", type=int, default=0, help="warm-up episodes (0 = one per corpus task)")
    ap.add_argument("--warmup-budget-s", type=float, default=150.0)
    ap.add_argument("--min-prompt-bucket", type=int, default=0, help="sampler's smallest prompt bucket (0 = 4096 on "
                                                                      "a GPU, 256 on CPU: few shapes to compile)")
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

    from actors.sampler import configure_device_memory

    configure_device_memory(args.mem_fraction)
    import jax

    from actors.config import ActorConfig, AgentConfig, StagesConfig
    from actors.policy import JaxPolicy, sampler_timing_lock
    from actors.sampler import Sampler
    from actors.weights import model_from_tensors, random_policy_tensors
    from learner.chat import ChatFormat
    from learner.model import ModelConfig
    from sandbox.client import SandboxClient
    from sandbox.config import SandboxConfig

    t_start = time.monotonic()
    on_gpu = jax.default_backend() == "gpu"
    backend = args.backend if args.backend != "auto" else ("cuda" if on_gpu else "cpu")  # no torch in this process
    fmt = "cubin" if backend == "cuda" else "cpu"
    node = None
    if args.sandbox:
        endpoints = [e for e in args.sandbox.split(",") if e]
    else:
        from sandbox.service import SandboxNode, ServiceConfig

        sb = SandboxConfig(backend=backend)
        if args.fast_sandbox:
            sb = SandboxConfig(backend=backend, num_trials=2, reps=5, use_compile=False, bootstrap_samples=500)
        node = SandboxNode(ServiceConfig(endpoint="tcp://127.0.0.1:0", node_id="bench-node", workers=args.workers,
                                         metrics_port=-1, sandbox=sb)).start()
        endpoints = [node.endpoint]
    corpus = load_corpus(fmt, [t for t in args.tasks.split(",") if t] or None)
    tok = build_tokenizer(corpus)
    chat = ChatFormat(tok)
    if args.model == "tiny":
        mcfg = ModelConfig.tiny(vocab_size=tok.vocab_size)
    else:
        mcfg = ModelConfig.qwen2_5_0_5b(param_dtype="bfloat16" if on_gpu else "float32",
                                        dtype="bfloat16" if on_gpu else "float32",
                                        attention_impl="cudnn" if on_gpu else "xla")
    t0 = time.monotonic()
    model = model_from_tensors(mcfg, random_policy_tensors(mcfg, seed=args.seed, std=0.02))
    agent = AgentConfig(max_turns=args.max_turns, max_context_tokens=32768, max_new_tokens_per_turn=4096,
                        solution_format=fmt, temperature=1.0, skill=args.skill)
    cfg = ActorConfig(actor_id="bench-actor", concurrent_episodes=args.concurrent, max_batch=64, agent=agent,
                      stages=StagesConfig(), max_cache_len=32768,
                      sampler_min_batch_bucket=1 << max(0, (args.concurrent - 1).bit_length()),
                      sampler_min_prompt_bucket=args.min_prompt_bucket or (4096 if on_gpu else 256))
    sampler = Sampler(model, cfg.sampler_config(), detokenize=tok.decode)
    inner = JaxPolicy(sampler, version=1, seed=args.seed, timing_lock=sampler_timing_lock("auto"))
    policy = ReplayPolicy(inner, tok, corpus, args.max_turns, args.think_tokens, seed=args.seed)
    setup_model_s = time.monotonic() - t0
    tasks = [task for task, _, _ in corpus.values()]
    results: dict[str, Any] = {"machine": _machine(), "jax_backend": jax.default_backend(), "format": fmt,
                               "model": args.model, "model_params": mcfg.num_params(), "args": vars(args) | {"out": str(args.out)},
                               "setup_model_s": setup_model_s}
    partial = args.out / "actor_bench.json"

    def note(msg: str) -> None:  # progress on stdout, and what is known so far on disk (a killed run keeps it)
        print(f"[{time.monotonic() - t_start:7.1f} s] {msg}", flush=True)
        partial.write_text(json.dumps(results | {"partial": True}, indent=2, default=str))

    note(f"model set up in {setup_model_s:.1f} s ({mcfg.num_params() / 1e6:.1f}M params); waiting for the node")
    with SandboxClient(endpoints, client_id="bench-actor") as client:
        if node is not None and not node.wait_ready(600):
            raise SystemExit("sandbox node workers did not come up")
        note(f"node ready; warm-up: {args.warmup_episodes or len(tasks)} episodes, budget {args.warmup_budget_s:.0f} s")
        t0 = time.monotonic()
        results["warmup"] = run_phase(args, cfg, chat, client, policy, fmt, tasks,
                                      args.warmup_episodes or len(tasks), args.warmup_budget_s)
        results["warmup"]["elapsed_s"] = time.monotonic() - t0
        note(f"warm-up done: {results['warmup']['episodes']} episodes in {results['warmup']['elapsed_s']:.0f} s; "
             f"measured phase, budget {args.budget_s:.0f} s")
        results["measured"] = run_phase(args, cfg, chat, client, policy, fmt, tasks, args.episodes, args.budget_s)
        note(f"measured phase done: {results['measured']['episodes']} episodes in {results['measured']['wall_s']:.0f} s")
    if node is not None:
        node.drain(30)
        node.close()
    results["total_s"] = time.monotonic() - t_start
    (args.out / "actor_bench.json").write_text(json.dumps(results, indent=2, default=str))

    m = results["measured"]
    print(f"\nactor bench: {results['machine']}; jax {results['jax_backend']}; {args.model} "
          f"({results['model_params'] / 1e6:.1f}M params); format {fmt}; {args.concurrent} concurrent, up to "
          f"{args.max_turns} turns")
    rows = [("episodes (measured)", f"{m['episodes']} in {m['wall_s']:.0f} s"),
            ("episodes / hour", f"{m['episodes_per_hour']:.0f}"),
            ("sampling busy", f"{m['sampling_busy']:.0%} (sampler idle {1 - m['sampling_busy']:.0%})"),
            ("sandbox busy", f"{m['sandbox_busy']:.0%} (sandbox idle {1 - m['sandbox_busy']:.0%})"),
            ("both / neither", f"{m['both']:.0%} / {m['idle']:.0%}"),
            ("node worker busy", f"{m['node_worker_busy']:.0%}"),
            ("sampler calls, mean / max batch", f"{m['sampler_calls']}, {m['mean_batch']:.1f} / {m['max_batch']}"),
            ("sampled tokens / s", f"{m['sampled_tokens_per_s']:.0f}"),
            ("sandbox calls", json.dumps(m["sandbox_calls"])), ("final statuses", json.dumps(m["final_status"])),
            ("contended finals / sampler lock waits", f"{m['contended_finals']} / {m['sampler_lock_waits']}"),
            ("warm-up", f"{results['warmup']['episodes']} episodes in {results['warmup']['elapsed_s']:.0f} s"),
            ("total", f"{results['total_s']:.0f} s")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
