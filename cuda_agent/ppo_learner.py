"""The learner process of the PPO stages (1 single-turn, 4 multi-turn) inside `cuda-agent train`: the learner
service (learner.service.LearnerService) configured from the run's TrainConfig for one stage.

    python -m cuda_agent.ppo_learner --run-dir RUN --stage single_turn_ppo --init POLICY_DIR --out OUT_DIR \\
        --trajectories tcp://127.0.0.1:P1 --weights tcp://127.0.0.1:P2

The service owns the protocol side (acked durable spool, weights publication), the buffer with its staleness
bound, `ppo_update`, the stage's trajectory store (RUN/learner/<stage>/stages, read by RFT and value
pre-training), metrics (RUN/learner/<stage>/metrics/metrics.jsonl), Orbax checkpoints and resume, and its ready
file (RUN/learner/<stage>/ready.json). This wrapper adds what the main job needs around it, per update
(`on_update`): the rollout figures the progress bar and the report show (pass rate, episodes/s, speed-ups of
correct episodes), a few trajectories rendered readable in RUN/trajectories/<stage>.md, and a Hugging Face
snapshot every `--export-every` updates for the driver's periodic evaluation. At the end it writes OUT_DIR (the
policy; the critic under OUT_DIR/critic). Exit codes as cuda_agent.stage_worker: 0 done, 3 stopped by SIGTERM
(checkpoint written), 1 error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("cuda_agent.ppo_learner")

EXIT_DONE, EXIT_ERROR, EXIT_STOPPED = 0, 1, 3


def render_trajectory(tok, traj, max_chars: int = 6000) -> str:
    """A trajectory as readable text: observation spans as they are, policy spans (loss mask 1) marked."""
    ids = np.asarray(traj.tokens)
    mask = np.asarray(traj.loss_mask) > 0
    parts, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            text = tok.decode(ids[start:i].tolist())
            parts.append(("\n>>> policy:\n" if mask[start] else "") + text)
            start = i
    out = "".join(parts)
    return out if len(out) <= max_chars else out[: max_chars // 2] + "\n[...]\n" + out[-max_chars // 2:]


def learner_config(cfg, stage: str):
    """The run's LearnerConfig with this stage's budgets: learning rates, trajectories per update, turn limit."""
    spec = getattr(cfg.stages, stage)
    lc = cfg.learner
    mb = max(1, min(lc.ppo.minibatch_size, spec.episodes_per_update))
    micro = max(1, min(lc.ppo.microbatch_size, mb))
    while mb % micro:
        micro -= 1
    # optimiser steps the stage can take: an update is `epochs` passes over its packed rows, at most one episode a
    # row, in minibatches of `mb` rows (rows hold several episodes, so the cosine rarely reaches its end; a bound
    # of 4 steps an update decayed the learning rate to its floor halfway through the stage at 4 epochs)
    steps = max(1, spec.updates * lc.ppo.epochs * math.ceil(spec.episodes_per_update / mb))
    # the warm-up is part of those steps (optax starts the decay after it) and at most a tenth of them: its first
    # step runs at learning rate 0, so a warm-up of `updates` steps left the first update unapplied
    warmup = min(lc.policy_optim.warmup_steps, steps // 10)
    return dataclasses.replace(
        lc,
        ppo=dataclasses.replace(lc.ppo, minibatch_size=mb, microbatch_size=micro,
                                temperature=spec.temperature if spec.temperature > 0 else lc.ppo.temperature),
        policy_optim=dataclasses.replace(lc.policy_optim, lr=spec.lr, decay_steps=max(1, steps - warmup),
                                         warmup_steps=warmup),
        critic_optim=dataclasses.replace(lc.critic_optim, lr=spec.critic_lr, decay_steps=steps, warmup_steps=0),
        stages=dataclasses.replace(lc.stages, single_turn_max_turns=1,
                                   multi_turn_max_turns=cfg.stages.multi_turn_ppo.max_turns,
                                   max_context_tokens=spec.max_context_tokens),
        batch_trajectories=spec.episodes_per_update,
        buffer_capacity=max(lc.buffer_capacity, spec.episodes_per_update),
        max_seq_len=max(lc.max_seq_len, spec.max_context_tokens),
        checkpoint=dataclasses.replace(lc.checkpoint, directory="checkpoints"),
    )


def run(args: argparse.Namespace) -> int:
    from cuda_agent.config import load_config
    from cuda_agent.prepare import runtime_overrides
    from cuda_agent.train_config import TrainConfig
    from learner.config import ServiceConfig
    from learner.hf_checkpoint import load_critic, load_pretrained
    from learner.model import Critic
    from learner.service import STATUS_STOPPED, LearnerService
    from learner.tokenizer import Tokenizer

    run_dir = Path(args.run_dir)
    cfg = load_config(TrainConfig, run_dir / "config.yaml")
    stage = args.stage
    spec = getattr(cfg.stages, stage)
    work = run_dir / "learner" / stage
    out = Path(args.out)
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    tok = Tokenizer.from_file(args.init)
    lcfg = learner_config(cfg, stage)
    svc = ServiceConfig(trajectories=args.trajectories, weights=args.weights, stage=stage, max_updates=spec.updates,
                        time_budget_s=spec.time_budget_s, curve=args.curve, curve_secret_key=args.curve_secret_key,
                        curve_authorized_keys=args.curve_authorized_keys)
    policy_model = load_pretrained(args.init, **runtime_overrides(cfg.model))
    critic_dir = Path(args.init) / "critic"
    critic_model = (load_critic(critic_dir, **runtime_overrides(cfg.model)) if (critic_dir / "config.json").exists()
                    else Critic.from_policy(policy_model))

    samples_md = run_dir / "trajectories" / f"{stage}.md"
    counts = {"episodes": 0, "passed": 0, "rendered": 0}
    clock = {"t": time.monotonic()}

    def on_update(service, trajs, m: dict) -> None:
        now = time.monotonic()
        ok = [t for t in trajs if (t.reward_details or {}).get("status") == "ok"]
        counts["episodes"] += len(trajs)
        counts["passed"] += len(ok)
        m["rollout/episodes"] = len(trajs)
        m["rollout/pass_rate"] = len(ok) / max(len(trajs), 1)
        m["rollout/episodes_per_s"] = len(trajs) / max(now - clock["t"], 1e-9)
        m["rollout/mean_tokens"] = float(np.mean([len(t.tokens) for t in trajs])) if trajs else 0.0
        m["rollout/episodes_total"] = counts["episodes"]
        built = [t for t in trajs if (t.reward_details or {}).get("status") not in
                 (None, "compile_error", "forbidden", "not_evaluated")]
        m["rollout/build_rate"] = len(built) / max(len(trajs), 1)
        clock["t"] = now
        sp = [t.reward_details.get("speedup_eager") for t in ok]
        sp = [s for s in sp if isinstance(s, (int, float)) and s > 0]
        if sp:
            m["rollout/speedup_eager_geomean"] = float(np.exp(np.mean(np.log(sp))))
        m["learner/updates_total"] = spec.updates
        log.info("%s update %d/%d: %d episodes (pass rate %.2f, reward mean %+.2f), %.0f tokens, pack %.1f s, "
                 "update %.1f s", stage, service.update, spec.updates, len(trajs), m["rollout/pass_rate"],
                 m.get("reward/mean", float("nan")), m.get("learner/tokens", 0), m.get("learner/pack_s", 0.0),
                 m.get("ppo/update_s", 0.0))
        for t in sorted(trajs, key=lambda t: -t.reward):
            if counts["rendered"] >= cfg.report.trajectories_per_stage * 2:
                break
            counts["rendered"] += 1
            with open(samples_md, "a") as f:
                f.write(f"## {t.episode_id}: task {t.task_id}, reward {t.reward:+g}, weights v{t.policy_version}, "
                        f"update {service.update}\n\n```text\n{render_trajectory(tok, t)}\n```\n\n")
        if args.export_every and service.update % args.export_every == 0 and service.update < spec.updates:
            snap = run_dir / "policies" / f"{stage}-u{service.update}"
            export(service.policy, service.critic, tok, snap)
            m["export"] = str(snap)

    service = LearnerService(lcfg, svc, work, policy_model, critic_model, on_update=on_update)
    del policy_model, critic_model
    t0 = time.monotonic()
    try:
        service.start()
        status = service.run(stop)
        if status == STATUS_STOPPED:
            return EXIT_STOPPED
        export(service.policy, service.critic, tok, out)
        (work / "result.json").write_text(json.dumps({
            "status": status, "updates": service.update, "version": service.version,
            "wall_s": time.monotonic() - t0, "episodes": counts["episodes"], "passed": counts["passed"],
            "counters": dict(service.counters), "receiver": dict(service.receiver.stats),
            "buffer": dict(service.buffer.stats)}, indent=2) + "\n")
        return EXIT_DONE
    finally:
        service.close()


def export(policy, critic, tok, out: Path) -> None:
    """Policy (+ critic under out/critic) as Hugging Face folders, written to a temporary name then renamed."""
    from learner.hf_checkpoint import save_pretrained

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(policy.model(), tmp, dtype="float32",
                    extra_config={"eos_token_id": tok.im_end_id, "bos_token_id": tok.im_start_id})
    tok.save(tmp / "tokenizer.json")
    save_pretrained(critic.model(), tmp / "critic", dtype="float32")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--stage", required=True, choices=("single_turn_ppo", "multi_turn_ppo"))
    p.add_argument("--init", required=True, help="policy folder (Hugging Face layout; critic under critic/)")
    p.add_argument("--out", required=True)
    p.add_argument("--trajectories", required=True, help="bind address of the trajectory receiver")
    p.add_argument("--weights", required=True, help="bind address of the weights publisher")
    p.add_argument("--export-every", type=int, default=0, help="Hugging Face snapshot every N updates (evaluation)")
    p.add_argument("--curve", default="auto", choices=("auto", "always", "never"),
                   help="CURVE on both channels (auto: on when bound beyond loopback)")
    p.add_argument("--curve-secret-key", default="", help="the learner's CURVE secret key file")
    p.add_argument("--curve-authorized-keys", default="", help="folder of the actors' public key files")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except Exception:  # noqa: BLE001
        log.exception("stage %s failed", args.stage)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
