"""The synthesis pipeline: compose candidates, filter them in parallel, drop near-duplicates, write JSONL.

Files:
  OUT (JSONL): accepted tasks, appended as they are accepted (each line a `tasks.schema.Task`).
  OUT.state.jsonl: one line per finished candidate (index, id, category, depth, verdict, times), appended
    as results arrive. Together they make a run resumable: a rerun with the same OUT skips every candidate
    index already in the state file, rebuilds the near-duplicate index from OUT, and continues until N
    tasks are accepted. Candidates that were in flight when a run stopped are composed again.

Balance: each new candidate's anchor category is the one with the fewest accepted-plus-in-flight tasks among
those below `max_category_fraction * n`, so no category exceeds its share and slow-to-accept categories
get more candidates. Depths are drawn uniformly from [min_depth, max_depth].
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tasks.compose import ComposeConfig, ComposeError, Composer, GraphComposer
from tasks.dedup import DedupIndex, benchmark_index
from tasks.filtering import FilterConfig, FilterPool, Verdict, accepted_task
from tasks.loaders import load_jsonl, task_to_json
from tasks.schema import Task


@dataclass
class SynthesisConfig:
    """Settings of one synthesis run.

    Fields:
      n: accepted tasks wanted.
      out: output JSONL path (the state file sits next to it).
      seed: composer seed (candidate i of a seed is always the same task).
      max_category_fraction: no category above this share of n.
      max_candidates: stop after this many candidates (0: 30 * n).
      benchmark: a benchmark folder/file; candidates near-duplicating one of its tasks are rejected
        ("contaminated"). Empty: no contamination check.
      exclude: task files whose tasks count as already taken: candidates near-duplicating them are rejected
        as "near_duplicate" (e.g. another split of the same release).
      same_ops_similarity, source_similarity: near-duplicate thresholds (tasks.dedup).
      inflight_per_worker: candidates queued per worker (keeps workers busy).
      filter: the execution filter's settings (autosize on by default here).
      compose: the graph composer's settings (seed is taken from `seed`).
    """

    n: int
    out: str
    seed: int = 0
    max_category_fraction: float = 0.30
    max_candidates: int = 0
    benchmark: str = ""
    exclude: list[str] = field(default_factory=list)
    same_ops_similarity: float = 0.5
    source_similarity: float = 0.95
    inflight_per_worker: int = 2
    filter: FilterConfig = field(default_factory=lambda: FilterConfig(autosize=True))
    compose: ComposeConfig = field(default_factory=ComposeConfig)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 0 < self.max_category_fraction <= 1:
            raise ValueError(f"max_category_fraction must be in (0, 1], got {self.max_category_fraction}")
        self.compose.seed = self.seed


@dataclass
class SynthesisReport:
    """What a run did (this run and earlier runs on the same files)."""

    accepted: int = 0
    candidates: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    categories: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    run_candidates: int = 0
    run_accepted: int = 0
    resumed_from: int = 0

    @property
    def accepted_per_min(self) -> float:
        return 60.0 * self.run_accepted / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def candidates_per_min(self) -> float:
        return 60.0 * self.run_candidates / self.elapsed_s if self.elapsed_s > 0 else 0.0


def state_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".state.jsonl")


def _read_state(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by an interruption
                continue
    return rows


def _append(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()


class Synthesizer:
    """Runs a synthesis (see the module docstring). `on_progress(report)` is called after every result."""

    def __init__(self, cfg: SynthesisConfig, composer: Composer | None = None):
        self.cfg = cfg
        self.composer = composer or GraphComposer(cfg.compose)
        self.categories: list[str] = list(getattr(self.composer, "categories", []))
        if not self.categories:
            raise ValueError("the composer must expose its `categories`")

    def _next_category(self, accepted: Counter, inflight: Counter) -> str | None:
        cap = max(1, int(self.cfg.max_category_fraction * self.cfg.n))
        open_ = [c for c in self.categories if accepted[c] < cap]
        if not open_:
            return None
        return min(open_, key=lambda c: (accepted[c] + inflight[c], self.categories.index(c)))

    def run(self, on_progress: Callable[[SynthesisReport], None] | None = None) -> SynthesisReport:
        cfg = self.cfg
        out, spath = Path(cfg.out), state_path(cfg.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        state = _read_state(spath)
        accepted_tasks = load_jsonl(out) if out.exists() else []
        # a candidate that ran the device out of memory on every try is composed and checked again on resume
        state = [r for r in state if r.get("reason") != "out_of_memory"]
        done_idx = {int(r["index"]) for r in state}
        rep = SynthesisReport(accepted=len(accepted_tasks), candidates=len(state),
                              reasons=dict(Counter(r["reason"] for r in state if not r["accepted"])),
                              resumed_from=len(state))
        accepted_cat = Counter(t.category for t in accepted_tasks)
        index = DedupIndex(cfg.same_ops_similarity, cfg.source_similarity)
        for t in accepted_tasks:
            index.add(t.id, t.metadata.get("signature", ()), t.reference)
        for path in cfg.exclude:
            for t in load_jsonl(path):
                index.add(t.id, t.metadata.get("signature", ()), t.reference)
        bench = benchmark_index(cfg.benchmark, cfg.same_ops_similarity, cfg.source_similarity) if cfg.benchmark else None
        max_candidates = cfg.max_candidates or 30 * cfg.n
        inflight: Counter = Counter()
        next_index = 0
        t0 = time.monotonic()

        def record(idx: int, task: Task | None, category: str, depth: int, v: Verdict) -> None:
            row = {"index": idx, "task_id": v.task_id, "category": category, "depth": depth,
                   "accepted": v.accepted, "reason": v.reason, "detail": v.detail[:300],
                   "eager_ms": v.eager_ms, "compile_ms": v.compile_ms, "check_s": round(v.check_s, 3),
                   "contended": v.contended, "oom_retries": v.oom_retries,
                   "lock_wait_s": round(v.lock_wait_s, 3)}
            _append(spath, json.dumps(row))
            rep.candidates += 1
            rep.run_candidates += 1
            if v.accepted and task is not None:
                _append(out, task_to_json(task))
                rep.accepted += 1
                rep.run_accepted += 1
                accepted_cat[category] += 1
            else:
                rep.reasons[v.reason] = rep.reasons.get(v.reason, 0) + 1
            rep.categories = dict(accepted_cat)
            rep.elapsed_s = time.monotonic() - t0
            if on_progress:
                on_progress(rep)

        with FilterPool(cfg.filter) as pool:
            meta: dict[str, tuple[int, str, int]] = {}
            while rep.accepted < cfg.n:
                want = cfg.filter.workers * cfg.inflight_per_worker
                # top up the pool, but never compose more than could still be needed
                while (pool.pending < want and rep.candidates + pool.pending < max_candidates
                       and rep.accepted + pool.pending < cfg.n + want):
                    while next_index in done_idx:
                        next_index += 1
                    idx = next_index
                    next_index += 1
                    cat = self._next_category(accepted_cat, inflight)
                    if cat is None:
                        break
                    depth = random.Random(f"depth:{cfg.seed}:{idx}").randint(cfg.compose.min_depth,
                                                                             cfg.compose.max_depth)
                    try:
                        task = self.composer.compose(idx, category=cat, depth=depth)
                    except ComposeError as e:
                        record(idx, None, cat, depth, Verdict(f"idx{idx}", False, "compose_error", str(e)))
                        continue
                    meta[task.id] = (idx, cat, depth)
                    inflight[cat] += 1
                    pool.submit(task)
                if pool.pending == 0:
                    break  # candidate budget spent or every category full
                for task, v in pool.poll(0.5):
                    idx, cat, depth = meta.pop(task.id)
                    inflight[cat] -= 1
                    final = accepted_task(task, v, cfg.filter) if v.accepted else None
                    if final is not None:
                        m = index.find(v.signature, final.reference)
                        if m is not None:
                            v.accepted, v.reason = False, "near_duplicate"
                            v.detail = f"{m.reason} match with {m.key} (similarity {m.similarity:.2f})"
                        elif bench is not None and (m := bench.find(v.signature, final.reference)) is not None:
                            v.accepted, v.reason = False, "contaminated"
                            v.detail = f"{m.reason} match with benchmark task {m.key} (similarity {m.similarity:.2f})"
                        elif rep.accepted >= cfg.n:
                            continue  # enough already: drop surplus results without recording them
                        else:
                            index.add(final.id, v.signature, final.reference)
                    record(idx, final, cat, depth, v)
        rep.elapsed_s = time.monotonic() - t0
        return rep
