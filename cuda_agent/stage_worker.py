"""The learner process of the offline stages (no actors): 0 warm start, 2 RFT, 3 value pre-training.

    python -m cuda_agent.stage_worker --run-dir RUN --stage warm_start --init POLICY_DIR --out OUT_DIR

It loads the run's config (RUN/config.yaml), the policy (and critic) from Hugging Face folders, builds its data,
runs the steps of its stage with the learner's jitted steps (learner.train_step / learner.stages), and writes the
result as a Hugging Face folder OUT_DIR (the policy; the critic under OUT_DIR/critic) for the next stage, the
actors and the evaluations. Data per stage:

  warm_start      the training tasks' demonstrations (tasks.demos) rendered as single-turn and multi-turn chats
                  (cuda_agent.corpus.demo_messages); loss on the assistant tokens only
  rft             the single-turn PPO stage's trajectories with final reward >= stages.rft.reward_threshold
                  (learner.stages.rft_select), read from the learner's stage store (--store), and with
                  stages.rft.repair_per_task two-turn repair sequences built from them (repair_sequences)
  value_pretrain  the critic regresses the Monte-Carlo returns of all of that stage's trajectories (mixed
                  rewards give the baseline something to learn; learner.stages.value_pretrain)

Budgets: `steps` optimiser steps or `time_budget_s`, whichever comes first; from REPLAN_AFTER steps on, the
cosine learning-rate schedule is fitted to the steps that fit in the time budget at the measured step time, so a
stage its budget cuts still ends annealed. Progress: one JSON line per step in
RUN/learner/<stage>/metrics/metrics.jsonl (learner.metrics.MetricsLogger), read by the train driver. Checkpoints
(learner.checkpoint, Orbax) go to RUN/learner/<stage>/ckpt every `checkpoint_every_s` seconds and on SIGTERM; a
restarted worker resumes from the newest one. Exit codes: 0 done, 3 stopped by SIGTERM (checkpoint written),
4 nothing to train on (e.g. RFT with no trajectory over the threshold: the stage is skipped, OUT_DIR is a copy of
the input policy), 1 error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("cuda_agent.stage_worker")

EXIT_DONE, EXIT_ERROR, EXIT_STOPPED, EXIT_NO_DATA = 0, 1, 3, 4
REPLAN_AFTER, REPLAN_EVERY = 12, 30
"""The learning-rate schedule is fitted to the time budget after REPLAN_AFTER steps, then every REPLAN_EVERY steps
(stage_worker.run: fit_schedule), on the median time of the steps so far."""
REPLAN_TOLERANCE = 0.05
"""A new plan is made when the steps that fit differ from the plan's by more than this share."""
REPLAN_COMPILE_S = 10.0
"""Seconds set aside for compiling the step again with the re-planned schedule."""
MAX_NONFINITE_STEPS = 5
"""Steps with a non-finite gradient are skipped (learner.train_step._apply); this many in a row end the stage with an
error (exit 1, learner.train_step.NonFiniteRun): a run that goes on trains nothing."""


@dataclasses.dataclass
class _Seq:
    """A pseudo-trajectory for packing (learner.batch.TrajectoryLike)."""

    episode_id: str
    tokens: np.ndarray
    loss_mask: np.ndarray
    behaviour_logprobs: np.ndarray
    reward: float = 0.0
    policy_version: int = 0


def fitted_steps(step: int, planned: int, max_steps: int, step_s: float, left_s: float) -> int | None:
    """The total steps of a new learning-rate plan, or None to keep the current one (`planned`).

    step: steps done; max_steps: the stage's own limit; step_s: measured seconds per step; left_s: seconds left
    in the time budget. The new plan ends when the budget does (at least one more step, at most max_steps); it is
    made only when it differs from the current plan by more than REPLAN_TOLERANCE and the current plan has at
    least REPLAN_EVERY steps to go."""
    fit = min(max_steps, step + max(1, int(left_s / step_s)))
    if abs(fit - planned) <= REPLAN_TOLERANCE * planned or planned - step < REPLAN_EVERY:
        return None
    return fit


def demo_sequences(cfg, chat, train_tasks, fmt: str, composed_tasks=()) -> tuple[list[_Seq], dict]:
    """Demonstrations of the training tasks as token sequences (single-turn and multi-turn renderings), and of
    the run's composed tasks (cuda_agent.corpus.composed_tasks; single-turn, and multi-turn too for the first
    round(stages.warm_start.composed_multi_turn x their number): "demos/composed_multi_turn_tasks" counts those
    tasks, whose multi-turn renderings count in "demos/too_long" when too long)."""
    from cuda_agent.corpus import demo_messages, demos_for

    ws = cfg.stages.warm_start
    out, too_long = [], 0
    composed = {t.id for t in composed_tasks}
    n_both = int(round(ws.composed_multi_turn * len(composed_tasks)))
    both = {t.id for t in list(composed_tasks)[:n_both]}
    for task, demo in demos_for(list(train_tasks) + list(composed_tasks), fmt, tuple(ws.variants)):
        for mode in ("single_turn",) if task.id in composed and task.id not in both else ("single_turn", "multi_turn"):
            max_turns = cfg.stages.multi_turn_ppo.max_turns if mode == "multi_turn" else 0
            r = chat.render(demo_messages(task, demo.files, fmt, mode, max_turns, demo.notes, cfg.actor.agent.skill))
            if len(r.ids) > ws.max_seq_len:
                too_long += 1
                continue
            out.append(_Seq(f"demo-{task.id}-{demo.variant}-{mode}", r.ids.astype(np.int32),
                            r.loss_mask.astype(np.uint8), np.zeros(len(r.ids), np.float32)))
    return out, {"demos/sequences": len(out), "demos/too_long": too_long,
                 "demos/tasks": len({s.episode_id.split('-')[1] for s in out}),
                 "demos/composed_tasks": len(composed), "demos/composed_multi_turn_tasks": len(both)}


def repair_sequences(cfg, chat, trajs, tasks, fmt: str) -> tuple[list[_Seq], dict]:
    """RFT's two-turn repair sequences (stages.rft.repair_per_task; cuda_agent.corpus.repair_messages) from the
    single-turn PPO stage's trajectories `trajs` (learner.stages.repair_pairs) and the Task objects of their
    tasks (`tasks`, by id). The loss mask covers only the last assistant turn (the repair and its finish): the
    failed reply is context, not something to learn. Left out and counted: pairs whose task is unknown; whose
    replies cannot be read back as tool calls, or a failed reply that was cut at the token limit ("unreadable");
    whose failed reply wrote a file the correct one does not (the chat's workspace would keep it: "stale_files");
    whose chat does not render or is longer than stages.rft.repair_max_tokens (0: learner.max_seq_len)."""
    from cuda_agent.corpus import repair_messages
    from learner import stages as lstages
    from learner.chat import ChatFormatError, ToolCallError, parse_tool_calls

    rft = cfg.stages.rft
    by_id = {t.id: t for t in tasks}
    out, skipped = [], {"no_task": 0, "unreadable": 0, "stale_files": 0, "too_long": 0}
    pairs = lstages.repair_pairs(trajs, rft.repair_per_task, rft.reward_threshold, cfg.seed)

    def reply(t) -> tuple[str, set[str]] | None:
        """The trajectory's first reply and the paths it writes, or None when it cannot be read back."""
        if (t.episode_stats or {}).get("truncated_turns"):
            return None
        try:
            msgs = chat.parse(np.asarray(t.tokens).tolist())
            text = next(m.content for m in msgs if m.role == "assistant")
            calls = parse_tool_calls(text)
        except (ChatFormatError, ToolCallError, StopIteration):
            return None
        paths = {str(c.arguments.get("path")) for c in calls if c.name == "write_file"}
        return (text, paths) if paths else None

    for bad, good in pairs:
        task = by_id.get(bad.task_id)
        if task is None:
            skipped["no_task"] += 1
            continue
        failed, fixed = reply(bad), reply(good)
        if failed is None or fixed is None:
            skipped["unreadable"] += 1
            continue
        if not failed[1] <= fixed[1]:
            skipped["stale_files"] += 1
            continue
        msgs = repair_messages(task, failed[0], bad.reward_details["observation"], fixed[0], fmt,
                               cfg.stages.multi_turn_ppo.max_turns, cfg.actor.agent.skill)
        try:
            r = chat.render(msgs)
        except ChatFormatError:
            skipped["unreadable"] += 1
            continue
        if len(r.ids) > (rft.repair_max_tokens or cfg.learner.max_seq_len):
            skipped["too_long"] += 1
            continue
        mask = r.loss_mask.astype(np.uint8)
        last = np.flatnonzero(mask)[-1]  # the repair turn is the chat's last run of 1s: zero every token before it
        mask[:np.flatnonzero(mask[:last] == 0)[-1] + 1] = 0
        out.append(_Seq(f"repair-{bad.episode_id}-{good.episode_id}", r.ids.astype(np.int32), mask,
                        np.zeros(len(r.ids), np.float32)))
    return out, {"data/repair_pairs": len(pairs), "data/repair_sequences": len(out),
                 **{f"data/repair_skipped_{k}": v for k, v in skipped.items()}}


def _row_len(seqs, cap: int) -> int:
    longest = max(len(s.tokens) for s in seqs)
    return int(min(cap, -(-longest // 256) * 256))


def row_length(spec, seqs, default_cap: int) -> int:
    """Tokens per packed row for a stage: its `row_len` when set (raised to the longest sequence), else the
    longest sequence rounded up to 256, at most its `max_seq_len` (or default_cap)."""
    explicit = getattr(spec, "row_len", 0)
    if explicit:
        return max(explicit, max(len(s.tokens) for s in seqs))
    return _row_len(seqs, getattr(spec, "max_seq_len", default_cap))


class _Stop:
    def __init__(self) -> None:
        self.flag = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, *_):
        self.flag = True


def microbatch_rows(requested: int, batch_rows: int) -> int:
    """Rows per forward/backward pass of a `batch_rows`-row step: `requested` (0 = all of them) capped at batch_rows
    and lowered to a divisor of it."""
    micro = max(1, min(requested or batch_rows, batch_rows))
    while batch_rows % micro:
        micro -= 1
    return micro


def _micro(tree, idx: np.ndarray, micro: int):
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x)[idx].reshape((len(idx) // micro, micro) + x.shape[1:])),
                        tree)


def run(args: argparse.Namespace) -> int:
    import jax
    from flax import nnx

    from cuda_agent.config import load_config
    from cuda_agent.corpus import train_and_eval_tasks
    from cuda_agent.train_config import TrainConfig
    from learner import stages as lstages
    from cuda_agent.prepare import runtime_overrides
    from learner.batch import pack_trajectories
    from learner.chat import ChatFormat
    from learner.checkpoint import LearnerCheckpointer, LearnerMeta
    from learner.config import OptimizerConfig, PPOConfig
    from learner.hf_checkpoint import load_critic, load_pretrained, save_pretrained
    from learner.metrics import MetricsLogger
    from learner.model import Critic
    from learner.tokenizer import Tokenizer
    from learner.train_step import (CriticBatch, NonFiniteRun, SequenceBatch, create_train_state, critic_train_step,
                                    make_optimizer, sft_train_step)

    run_dir = Path(args.run_dir)
    cfg = load_config(TrainConfig, run_dir / "config.yaml")
    stage = args.stage
    spec = getattr(cfg.stages, stage)
    work = run_dir / "learner" / stage
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    stop = _Stop()
    metrics = MetricsLogger(work / "metrics", tensorboard=False)
    tok = Tokenizer.from_file(args.init)
    chat = ChatFormat(tok)
    fmt = args.format

    # ---------------------------------------------------------------------------------------------- data
    t0 = time.monotonic()
    info: dict = {}
    if stage == "warm_start":
        train_tasks, eval_tasks = train_and_eval_tasks(cfg.tasks.train, cfg.tasks.eval, args.device,
                                                       cfg.tasks.max_train_tasks, cfg.tasks.max_eval_tasks, cfg.seed)
        from cuda_agent.prepare import write_composed

        seqs, info = demo_sequences(cfg, chat, train_tasks, fmt, write_composed(run_dir, cfg, eval_tasks))
    else:
        store = lstages.StageStore(args.store)
        trajs = store.read_all("single_turn_ppo")
        store.close()
        info = {"data/trajectories": len(trajs)}
        seqs = list(trajs)
        if stage == "rft":
            seqs = lstages.rft_select(trajs, cfg.stages.rft.reward_threshold, cfg.stages.rft.max_task_pass_rate)
            info["data/kept"] = len(seqs)
            if cfg.stages.rft.repair_per_task:
                from tasks.loaders import load_jsonl

                rollout = run_dir / "tasks" / "rollout.jsonl"
                repairs, rinfo = repair_sequences(cfg, chat, trajs, load_jsonl(rollout) if rollout.exists() else [],
                                                  fmt)
                seqs += repairs
                info.update(rinfo)
    metrics.log(0, {**info, "data/build_s": time.monotonic() - t0})
    if not seqs:
        log.warning("stage %s: nothing to train on (%s); the policy passes through unchanged", stage, info)
        _copy_policy(Path(args.init), out)
        (work / "result.json").write_text(json.dumps({"status": "no_data", **info}) + "\n")
        return EXIT_NO_DATA
    row_len = row_length(spec, seqs, cfg.learner.max_seq_len)
    batch, refused = pack_trajectories(seqs, row_len, rows_multiple=spec.batch_rows, pack=True)
    log.info("stage %s: %d sequences in %d rows of %d tokens (%d refused)", stage, len(seqs), batch.num_rows, row_len,
             len(refused))

    # ---------------------------------------------------------------------------------------------- state
    total_steps = spec.steps
    if getattr(spec, "max_epochs", 0):
        total_steps = min(spec.steps, max(1, int(np.ceil(spec.max_epochs * batch.num_rows / spec.batch_rows))))
    info[f"{stage}/planned_steps"] = total_steps
    micro = microbatch_rows(args.microbatch or getattr(spec, "microbatch_rows", 0), spec.batch_rows)
    info[f"{stage}/microbatch_rows"] = micro
    ppo_cfg = PPOConfig(minibatch_size=spec.batch_rows, microbatch_size=micro, logits_chunk_size=512,
                        gamma=cfg.learner.ppo.gamma)
    def optimizer(total: int) -> OptimizerConfig:
        warm = min(getattr(spec, "warmup_steps", 5), max(1, total // 5))
        return OptimizerConfig(lr=spec.lr, warmup_steps=warm, decay_steps=max(1, total - warm), schedule="cosine",
                               end_lr_ratio=0.1, grad_clip_norm=1.0)

    max_steps = total_steps
    plan_file = work / "plan.json"
    if plan_file.exists():  # a restarted worker keeps the schedule it re-planned (see fit_schedule below)
        total_steps = int(json.loads(plan_file.read_text())["total_steps"])
    optim = optimizer(total_steps)
    policy_model = load_pretrained(args.init, **runtime_overrides(cfg.model))
    if stage == "value_pretrain":
        critic_dir = Path(args.init) / "critic"
        net = (load_critic(critic_dir, **runtime_overrides(cfg.model)) if (critic_dir / "config.json").exists()
               else Critic.from_policy(policy_model))
    else:
        net = policy_model
    state = create_train_state(net, optim, ppo_cfg)
    ckpt = LearnerCheckpointer(work / "ckpt", max_to_keep=2, async_save=False)
    step = 0
    key = jax.random.key(cfg.seed + 17)
    if ckpt.latest_step() is not None:
        restored, _, _, meta = ckpt.restore(policy=state)
        state, step = restored, meta.update
        key = meta.key() if meta.key() is not None else key
        log.info("stage %s: resumed at step %d", stage, step)

    seq = SequenceBatch(batch.tokens, batch.positions, batch.segment_ids, batch.loss_mask)
    if stage == "value_pretrain":
        returns = lstages.monte_carlo_returns(batch, ppo_cfg.gamma)
        full = CriticBatch(seq, returns, np.zeros_like(returns))
        state = state.replace(ppo=dataclasses.replace(ppo_cfg, value_clip_eps=None))
        step_fn, data = critic_train_step, full
    else:
        step_fn, data = sft_train_step, seq

    last_save = [time.monotonic()]

    def save() -> None:
        last_save[0] = time.monotonic()
        ckpt.save(step, policy=state, meta=LearnerMeta(update=step, stage=stage, rng_key=LearnerMeta.key_data(key)),
                  force=True)
        ckpt.wait()

    def export(dst: Path) -> None:
        """The policy (with the input's critic, or the trained critic for value_pretrain) as a Hugging Face
        folder at dst, written to dst.tmp first and renamed."""
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if stage == "value_pretrain":
            _copy_policy(Path(args.init), tmp)
            save_pretrained(nnx.merge(state.graphdef, state.params, state.rest), tmp / "critic", dtype="float32")
        else:
            save_pretrained(nnx.merge(state.graphdef, state.params, state.rest), tmp, dtype="float32",
                            extra_config={"eos_token_id": tok.im_end_id, "bos_token_id": tok.im_start_id})
            tok.save(tmp / "tokenizer.json")
            src_critic = Path(args.init) / "critic"
            if src_critic.exists():
                shutil.copytree(src_critic, tmp / "critic")
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)

    t_start = time.monotonic()
    status = "done"
    tokens_done = 0
    step_times: list[float] = []
    next_plan = step + REPLAN_AFTER

    def fit_schedule() -> None:
        """Fit the cosine learning-rate schedule to the steps that fit in the time budget at the measured step
        time: a stage its budget cuts half-way through the schedule would end at a high learning rate, one whose
        schedule ends with the budget ends annealed. Re-planned as the machine's load changes (each new plan
        compiles the step again, a few seconds); the plan is kept in plan.json for a restarted worker."""
        nonlocal total_steps, state
        per_step = float(np.median(step_times[2:]))  # all steps but the first (compiling) ones: the load of a
        # shared machine comes and goes within minutes, a short window makes the plan swing with it
        fit = fitted_steps(step, total_steps, max_steps, per_step,
                           spec.time_budget_s - (time.monotonic() - t_start) - REPLAN_COMPILE_S)
        if fit is None:
            return
        total_steps = fit
        tx, sched = make_optimizer(optimizer(total_steps))
        state = state.replace(tx=tx, lr_schedule=sched)  # same Optax state layout: moments and count carry over
        plan_file.write_text(json.dumps({"total_steps": total_steps, "step_s": per_step, "at_step": step}) + "\n")
        info[f"{stage}/planned_steps"] = total_steps
        info[f"{stage}/replans"] = info.get(f"{stage}/replans", 0) + 1
        log.info("stage %s: %.2f s per step at step %d: %d steps fit in the time budget, schedule re-planned", stage,
                 per_step, step, total_steps)

    nonfinite = NonFiniteRun(f"stage {stage}", "step", MAX_NONFINITE_STEPS)
    while step < total_steps:
        key, sub = jax.random.split(key)
        for idx in lstages.minibatch_indices(batch.num_rows, spec.batch_rows, sub, 1):
            if step >= total_steps:
                break
            if stop.flag:
                status = "stopped"
                break
            if time.monotonic() - t_start > spec.time_budget_s:
                status = "time_budget"
                break
            ts = time.monotonic()
            state, m = step_fn(state, _micro(data, idx, micro))
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            if nonfinite.observe(any(v for k, v in m.items() if k.endswith("/skipped_nonfinite")), step + 1):
                info[f"{stage}/skipped_nonfinite"] = nonfinite.total
            n_tok = int(np.count_nonzero(batch.segment_ids[idx]))
            tokens_done += n_tok
            step += 1
            dt = time.monotonic() - ts
            step_times.append(dt)
            if step >= next_plan:
                fit_schedule()
                next_plan = step + REPLAN_EVERY
            m.update({f"{stage}/step_s": dt, f"{stage}/tokens_per_s": n_tok / dt,
                      f"{stage}/elapsed_s": time.monotonic() - t_start, f"{stage}/steps_total": total_steps})
            metrics.log(step, m)
            if args.checkpoint_every_s and time.monotonic() - last_save[0] >= args.checkpoint_every_s:
                save()
            if args.export_every and step % args.export_every == 0 and stage != "value_pretrain":
                export(out.with_name(f"{out.name}-step{step}"))
        if status != "done":
            break
    save()
    if status == "stopped":
        metrics.close()
        ckpt.close()
        return EXIT_STOPPED

    # ---------------------------------------------------------------------------------------------- export
    export(out)
    result = {"status": status, "steps": step, "tokens": tokens_done, "wall_s": time.monotonic() - t_start,
              "rows": batch.num_rows, "row_len": row_len, **info}
    (work / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    metrics.close()
    ckpt.close()
    return EXIT_DONE


def _copy_policy(src: Path, dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--stage", required=True, choices=("warm_start", "rft", "value_pretrain"))
    p.add_argument("--init", required=True, help="policy folder (Hugging Face layout) to start from")
    p.add_argument("--out", required=True, help="policy folder to write")
    p.add_argument("--store", default="", help="the learner's stage store (rft, value_pretrain)")
    p.add_argument("--format", default="cpu", help="solution format of the demonstrations")
    p.add_argument("--device", default="cpu", help="cpu | cuda (task sizes)")
    p.add_argument("--microbatch", type=int, default=0,
                   help="rows per forward/backward pass (0 = the stage's microbatch_rows for warm_start, else all "
                        "rows of a step at once; on the 2-core box 2-row passes of the local preset's 4-row steps "
                        "were 15%% faster: benchmarks/RESULTS.md, session 30)")
    p.add_argument("--checkpoint-every-s", type=float, default=300.0,
                   help="seconds between checkpoints (0 = only at the end and on SIGTERM). By time, not steps: a "
                        "0.5B checkpoint takes about 12 s on the H200 and every 25 steps it cost more than the steps")
    p.add_argument("--export-every", type=int, default=0,
                   help="also write the policy every N steps to OUT_DIR-stepN (a learning curve; 0 = off)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except Exception:  # noqa: BLE001 - logged for the driver, which reads the exit code
        log.exception("stage %s failed", args.stage)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
