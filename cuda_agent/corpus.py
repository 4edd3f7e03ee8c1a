"""Data for a run: the task splits, the tokenizer's training corpus, and demonstrations rendered as chats.

Demonstrations (`tasks.demos`) become supervised examples in the exact chat format the agent loop uses
(`actors.skill` system prompt and task prompt, `learner.chat` tool-call syntax), in two renderings:

  single_turn:  system (single-turn skill) | user (task) | assistant: write_file calls for every file
  multi_turn:   system (multi-turn skill)  | user (task) | assistant: write_file calls for every file, then finish

so the warm-started policy already speaks the tool syntax of both modes. Evaluation tasks never get
demonstrations (`tasks.builtin` keeps them apart); `check_disjoint` refuses a run whose eval split overlaps
the training tasks.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from tasks.schema import Task

MODES = ("single_turn", "multi_turn")


def _resolve_split(name: str, device: str) -> str:
    if name == "auto_train":
        return "gpu_train" if device == "cuda" else "cpu_train"
    if name == "auto_eval":
        return "gpu_eval" if device == "cuda" else "cpu_eval"
    return name


def load_source(name: str, device: str) -> list[Task]:
    """Tasks of a built-in split name ("single_op", "cpu_train", "auto_train", ...) or of a path (KernelBench
    folder, .jsonl, .parquet, .py or folder of .py). Raises ValueError for an unknown split / unreadable path."""
    from tasks import builtin

    split = _resolve_split(name, device)
    if split in builtin.SPLITS:
        return builtin.load_split(split)
    p = Path(split)
    if not p.exists():
        raise ValueError(f"task source {name!r} is neither a built-in split ({', '.join(builtin.SPLITS)}, auto_train, "
                         f"auto_eval) nor an existing path")
    from tasks.loaders import load_tasks

    return load_tasks(p)


def train_and_eval_tasks(train: Sequence[str], eval_source: str, device: str, max_train: int = 0, max_eval: int = 0,
                         seed: int = 0) -> tuple[list[Task], list[Task]]:
    """(training tasks, evaluation tasks). GPU-sized built-in tasks are taken at their CPU size when the device is
    the CPU. Training tasks are deduplicated by id; with max_train a seeded sample is kept (demonstration tasks
    first is not implied). Raises ValueError when either set is empty or they share a task id or reference."""
    from tasks import builtin

    tr: list[Task] = []
    seen: set[str] = set()
    for name in train:
        for t in load_source(name, device):
            if t.id not in seen:
                seen.add(t.id)
                tr.append(t)
    ev = load_source(eval_source, device)
    if device != "cuda":
        tr = [builtin.at_cpu_size(t) for t in tr]
        ev = [builtin.at_cpu_size(t) for t in ev]
    if max_train and len(tr) > max_train:
        rng = random.Random(seed)
        tr = sorted(rng.sample(tr, max_train), key=lambda t: t.id)
    if max_eval:
        ev = ev[:max_eval]
    if not tr:
        raise ValueError("no training tasks (tasks.train)")
    if not ev:
        raise ValueError("no evaluation tasks (tasks.eval)")
    check_disjoint(tr, ev)
    return tr, ev


def check_disjoint(train: Sequence[Task], eval_tasks: Sequence[Task]) -> None:
    """Raise ValueError naming the first evaluation task that is also a training task (same id or same source)."""
    ids = {t.id for t in train}
    refs = {t.content_hash for t in train}
    for t in eval_tasks:
        if t.id in ids or t.content_hash in refs:
            raise ValueError(f"evaluation task {t.id} is also a training task: the eval split must be held out")


def composed_tasks(n: int, seed: int, eval_tasks: Sequence[Task], id_prefix: str = "comp") -> list[Task]:
    """`n` extra training tasks for the warm start, composed on the spot: compositions of the demonstration
    family's operators (tasks.builtin.build_family.family_composer, seeded), each with a demonstration made by the
    generator. Not execution-filtered like the built-in splits (a demonstration only has to be a correct
    translation of its reference; tests check a sample of them in the sandbox). The warm start's are never run as
    rollout tasks; `tasks.rollout_composed` makes a fresh set for the rollouts with a seed of its own.

    Held out: a composition with the operator chain of an evaluation task (or its very source) is skipped, so the
    evaluation tasks stay unseen compositions (pass more tasks in `eval_tasks` to hold their chains out too).
    Deterministic in (n, seed, eval_tasks); ids "<id_prefix>_<seed>_<index>".
    About 10 ms per task on one core."""
    if n <= 0:
        return []
    from tasks.builtin.build_family import family_composer

    chains = {tuple(t.operators) for t in eval_tasks}
    sources = {t.reference for t in eval_tasks}
    comp = family_composer(10_000 + seed)
    rng = random.Random(f"composed:{seed}")
    out: list[Task] = []
    index = 0
    while len(out) < n and index < 20 * n:
        cat = comp.categories[index % len(comp.categories)]
        try:
            t = comp.compose(index, category=cat, depth=rng.randint(2, 4))
        except Exception:  # noqa: BLE001 - ComposeError: no composition for this slot, take the next
            index += 1
            continue
        index += 1
        if tuple(t.operators) in chains or t.reference in sources:
            continue
        out.append(t.replace(id=f"{id_prefix}_{seed}_{index - 1:05d}"))  # source stays "synthesized"
    return out


def fresh_compositions(n: int, run_seed: int, eval_tasks: Sequence[Task], warm_start_tasks: Sequence[Task]) -> list[Task]:
    """`n` rollout tasks for `tasks.rollout_composed`: compositions of the demonstration family whose operator
    chains are in neither the evaluation split nor the warm start's composed tasks (so no demonstration of them was
    trained on). A composer seed of its own (1_000_000 + run seed; the warm start's is the run seed), ids
    "fresh_<seed>_<index>"."""
    return composed_tasks(n, 1_000_000 + run_seed, list(eval_tasks) + list(warm_start_tasks), id_prefix="fresh")


def demos_for(tasks: Sequence[Task], fmt: str, variants: Sequence[str]) -> list[tuple[Task, object]]:
    """(task, Demo) pairs of the given format and variants, for every task a generator covers."""
    from tasks.demos import demonstrations

    out = []
    for t in tasks:
        for d in demonstrations(t, (fmt,)):
            if d.variant in variants:
                out.append((t, d))
    return out


def demo_messages(task: Task, files: dict[str, str], fmt: str, mode: str, max_turns: int = 0, notes: str = "",
                  skill: str = "full"):
    """The chat of one demonstration (see the module doc): a list of learner.chat.Message."""
    from actors.skill import system_prompt, task_prompt
    from learner.chat import Message, format_tool_call

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    order = sorted(files, key=lambda p: (p == "model_new.py", p))  # kernels first, then model_new.py
    parts = [f"Plan: {notes}." if notes else "Plan: write the kernels, then model_new.py."]
    parts += [format_tool_call("write_file", {"path": p, "content": files[p]}) for p in order]
    if mode == "multi_turn":
        parts.append(format_tool_call("finish", {}))
    return [Message("system", system_prompt(fmt, mode, max_turns, skill)),
            Message("user", task_prompt(task, fmt, mode)),
            Message("assistant", "\n".join(parts))]


def repair_messages(task: Task, failed_reply: str, observation: str, fixed_reply: str, fmt: str, max_turns: int = 0,
                    skill: str = "full"):
    """A two-turn multi-turn chat (learner.chat.Message list) that repairs a failed solution, built from the
    policy's own samples of `task` (stages.rft.repair_per_task): its failed reply, then finish; the refusal that
    AgentConfig.verify_on_finish gives, quoting `observation` (the real verify observation of that reply's final
    evaluation); then a correct reply of the same task, then finish. The replies are single-turn replies
    (write_file calls); both get the finish call a multi-turn episode ends with."""
    from actors.observations import refused_finish_observation
    from actors.skill import system_prompt, task_prompt
    from learner.chat import Message, format_tool_call, neutralise_special_tokens

    finish = format_tool_call("finish", {})
    return [Message("system", system_prompt(fmt, "multi_turn", max_turns, skill)),
            Message("user", task_prompt(task, fmt, "multi_turn")),
            Message("assistant", failed_reply.rstrip() + "\n" + finish),
            Message("tool", neutralise_special_tokens(refused_finish_observation(observation))),
            Message("assistant", fixed_reply.rstrip() + "\n" + finish)]


def tokenizer_corpus(train: Sequence[Task], fmt: str, max_turns: int = 8, skill: str = "full",
                     variants: Sequence[str] = ("naive", "fused", "fast")) -> Iterator[str]:
    """Texts a from-scratch tokenizer is trained on: the skill prompts (once per demonstration, as often as the
    warm start's sequences hold them), the training tasks' prompts and their demonstrations of the given variants
    (those the warm start uses) rendered as chats. Evaluation tasks stay out:
    a merge seen only in their prompts would be a token whose embedding no training step ever touched."""
    from actors.skill import system_prompt, task_prompt

    pairs = demos_for(train, fmt, tuple(variants))
    for mode in MODES:  # as often as the warm start's sequences hold it: merges across spaces make it a few tokens
        for _ in range(max(1, len(pairs))):
            yield system_prompt(fmt, mode, max_turns, skill)
    for t in train:
        yield task_prompt(t, fmt, "single_turn")
    for t, d in pairs:
        for m in demo_messages(t, d.files, fmt, "single_turn", notes=d.notes):
            if m.role == "assistant":
                yield m.content


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2, split: str = "words",
                    max_token_length: int = 0):
    """A byte-level BPE (learner.tokenizer.train_bpe) on `texts`."""
    from learner.tokenizer import train_bpe

    return train_bpe(list(texts), vocab_size=vocab_size, min_frequency=min_frequency, split=split,
                     max_token_length=max_token_length or None)
