"""Before the first stage: the tokenizer and the initial policy, written to `<run>/model/` in Hugging Face layout
(config.json, model.safetensors, tokenizer.json) so every process (learner, actors, evaluations) loads the same
thing from disk.

From scratch (model.init=scratch): a byte-level BPE trained on the training tasks' corpus (cuda_agent.corpus) and a
randomly initialised Qwen2-layout transformer of the configured shape. From a checkpoint (model.init=hf): the
folder is used as it is (its tokenizer.json must hold the ChatML special tokens).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

from cuda_agent.train_config import ModelSpec, TokenizerSpec
from tasks.schema import Task


def model_config(spec: ModelSpec, vocab_size: int):
    """learner.model.ModelConfig for a from-scratch model (vocab rounded up to a multiple of 64)."""
    from learner.model import ModelConfig

    vocab = ((vocab_size + 63) // 64) * 64
    return ModelConfig(vocab_size=vocab, hidden_size=spec.hidden_size, num_layers=spec.num_layers,
                       num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                       intermediate_size=spec.intermediate_size, rope_theta=10_000.0,
                       max_position_embeddings=spec.max_position_embeddings, tie_embeddings=True, qkv_bias=True,
                       dtype=spec.dtype, param_dtype=spec.param_dtype, remat=spec.remat,
                       remat_policy=spec.remat_policy, attention_impl=spec.attention_impl)


def runtime_overrides(spec: ModelSpec) -> dict:
    """The ModelConfig fields a stage takes from the run's model spec, not from the checkpoint's config.json
    (which holds the shape only): compute and parameter dtypes, rematerialisation and the attention
    implementation. Pass them to learner.hf_checkpoint.load_pretrained / load_critic."""
    return {"dtype": spec.dtype, "param_dtype": spec.param_dtype, "remat": spec.remat,
            "remat_policy": spec.remat_policy, "attention_impl": spec.attention_impl}


def prepare_model(out: Path, model: ModelSpec, tok_spec: TokenizerSpec, train: Sequence[Task],
                  eval_tasks: Sequence[Task], fmt: str, seed: int = 0, skill: str = "full",
                  variants: Sequence[str] = ("naive", "fused", "fast")) -> dict:
    """Write tokenizer.json and the initial checkpoint into `out` (skipped when `out/config.json` exists: resume).
    The tokenizer's corpus holds the demonstrations of `variants` (those the warm start trains on).
    Returns a summary {"path", "params", "vocab_size", "tokenizer_s", "init_s"}. Raises ValueError when a given
    checkpoint lacks config.json or tokenizer.json."""
    out.mkdir(parents=True, exist_ok=True)
    info_path = out / "prepare.json"
    if model.init == "hf":
        src = Path(model.hf_path)
        for f in ("config.json", "tokenizer.json"):
            if not (src / f).exists():
                raise ValueError(f"model.hf_path={src}: missing {f}")
        return {"path": str(src), "source": "hf"}
    if (out / "config.json").exists() and info_path.exists():
        return json.loads(info_path.read_text())
    import jax
    from flax import nnx

    from cuda_agent.corpus import tokenizer_corpus, train_tokenizer
    from learner.hf_checkpoint import save_pretrained
    from learner.model import Transformer
    from learner.tokenizer import Tokenizer

    t0 = time.monotonic()
    if tok_spec.path:
        tok = Tokenizer.from_file(tok_spec.path)
    else:
        tok = train_tokenizer(tokenizer_corpus(train, fmt, skill=skill, variants=variants), tok_spec.vocab_size,
                              tok_spec.min_frequency, tok_spec.split, tok_spec.max_token_length)
    tok.save(out / "tokenizer.json")
    t1 = time.monotonic()
    cfg = model_config(model, tok.vocab_size)
    net = Transformer(cfg, nnx.Rngs(params=jax.random.key(seed)))
    save_pretrained(net, out, dtype="float32",
                    extra_config={"eos_token_id": tok.im_end_id, "bos_token_id": tok.im_start_id})
    info = {"path": str(out), "source": "scratch", "params": int(cfg.num_params()), "vocab_size": tok.vocab_size,
            "model_vocab_size": cfg.vocab_size, "tokenizer_s": round(t1 - t0, 2),
            "init_s": round(time.monotonic() - t1, 2)}
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def composed_path(run: Path) -> Path:
    """RUN/tasks/composed.jsonl: the warm start's composed tasks (cuda_agent.corpus.composed_tasks)."""
    return run / "tasks" / "composed.jsonl"


def write_composed(run: Path, cfg, eval_tasks: Sequence[Task]) -> list[Task]:
    """The run's composed warm-start tasks (stages.warm_start.composed_tasks of them, seeded by the run seed), made
    once and kept in RUN/tasks/composed.jsonl for the stage worker; read back when the file exists (resume)."""
    from cuda_agent.corpus import composed_tasks
    from tasks.loaders import load_jsonl, write_jsonl

    path = composed_path(run)
    n = cfg.stages.warm_start.composed_tasks
    if path.exists():
        return load_jsonl(path)
    tasks = composed_tasks(n, cfg.seed, eval_tasks) if cfg.stages.warm_start.enabled else []
    write_jsonl(tasks, path)
    return tasks


def main(argv: list[str] | None = None) -> int:
    """`python -m cuda_agent.prepare RUN_DIR --device cpu --format cpu`: prepare_model for a run folder (the train
    driver runs it as a child so that the driver itself never imports JAX). Prints the summary as JSON."""
    import argparse
    import sys

    from cuda_agent.config import load_config
    from cuda_agent.train_config import TrainConfig
    from tasks.loaders import load_jsonl

    p = argparse.ArgumentParser(description="Write the tokenizer and the initial model of a run.")
    p.add_argument("run_dir")
    p.add_argument("--format", default="cpu")
    args = p.parse_args(argv)
    run = Path(args.run_dir)
    cfg = load_config(TrainConfig, run / "config.yaml")
    train = load_jsonl(run / "tasks" / "train.jsonl")
    ev = load_jsonl(run / "tasks" / "eval.jsonl")
    t0 = time.monotonic()
    composed = write_composed(run, cfg, ev)
    composed_s = time.monotonic() - t0
    info = prepare_model(run / "model", cfg.model, cfg.tokenizer, train + composed, ev, args.format, cfg.seed,
                         cfg.actor.agent.skill, tuple(cfg.stages.warm_start.variants))
    info = {**info, "composed_tasks": len(composed), "composed_s": round(composed_s, 2)}
    sys.stdout.write(json.dumps(info) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
