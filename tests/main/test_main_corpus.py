"""The warm start's data: demonstrations rendered exactly as the agent loop prompts, loss on the reply only, and
the local preset's demonstrations short enough to train on whole."""

from pathlib import Path

import numpy as np
import pytest

from actors.skill import system_prompt, task_prompt
from cuda_agent.config import load_config
from cuda_agent.corpus import demo_messages, demos_for, tokenizer_corpus, train_and_eval_tasks, train_tokenizer
from cuda_agent.train_config import TrainConfig
from learner.chat import ChatFormat, ChatTokens, Message

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def local():
    cfg = load_config(TrainConfig, CONFIGS / "local.yaml")
    train, ev = train_and_eval_tasks(cfg.tasks.train, cfg.tasks.eval, "cpu")
    tok = train_tokenizer(tokenizer_corpus(train, "cpu", skill=cfg.actor.agent.skill,
                                           variants=tuple(cfg.stages.warm_start.variants)),
                          cfg.tokenizer.vocab_size, cfg.tokenizer.min_frequency, cfg.tokenizer.split,
                          cfg.tokenizer.max_token_length)
    return cfg, train, ev, ChatFormat(tok)


@pytest.mark.parametrize("mode", ["single_turn", "multi_turn"])
def test_demo_prompt_is_the_episode_prompt_and_only_the_reply_is_trained(local, mode):
    cfg, train, _, chat = local
    skill = cfg.actor.agent.skill
    max_turns = cfg.stages.multi_turn_ppo.max_turns if mode == "multi_turn" else 0
    task, demo = demos_for(train, "cpu", tuple(cfg.stages.warm_start.variants))[0]
    r = chat.render(demo_messages(task, demo.files, "cpu", mode, max_turns, demo.notes, skill))
    # what actors.episode.EpisodeRunner feeds the sampler for the same task
    prompt = ChatTokens(chat, [Message("system", system_prompt("cpu", mode, max_turns, skill)),
                               Message("user", task_prompt(task, "cpu", mode))]).context()
    assert r.ids[:len(prompt)].tolist() == prompt
    assert not r.loss_mask[:len(prompt)].any()
    # the reply and its closing <|im_end|> are trained; the newline after it frames the next turn (mask 0)
    assert r.loss_mask[len(prompt):-1].all() and r.loss_mask[-1] == 0
    assert r.ids[-2] == chat.tokenizer.im_end_id
    reply = chat.tokenizer.decode(r.ids[len(prompt):-2].tolist())
    assert reply == demo_messages(task, demo.files, "cpu", mode, max_turns, demo.notes, skill)[-1].content


def test_local_preset_demos_fit_whole_and_eval_tasks_have_none(local):
    cfg, train, ev, chat = local
    pairs = demos_for(train, "cpu", tuple(cfg.stages.warm_start.variants))
    demo_tasks = {t.id for t, _ in pairs}
    assert len(demo_tasks) >= 0.9 * len(train)  # the family split: (nearly) every training task has one
    assert not demo_tasks & {t.id for t in ev}
    lens = [len(chat.render(demo_messages(t, d.files, "cpu", "single_turn", 0, d.notes,
                                          cfg.actor.agent.skill)).ids) for t, d in pairs]
    assert max(lens) <= cfg.stages.warm_start.max_seq_len  # no demonstration is dropped as too long
    assert np.median(lens) < 0.5 * cfg.stages.warm_start.max_seq_len


def test_fresh_rollout_compositions_are_unseen_chains(local):
    from cuda_agent.corpus import composed_tasks, fresh_compositions

    _, train, ev, _ = local
    warm = composed_tasks(300, 0, ev)
    fresh = fresh_compositions(40, 0, ev, warm)
    assert len(fresh) == 40 and all(t.id.startswith("fresh_1000000_") for t in fresh)
    seen = {tuple(t.operators) for t in list(ev) + warm}
    assert not [t.id for t in fresh if tuple(t.operators) in seen]
    assert not {t.reference for t in fresh} & {t.reference for t in list(ev) + list(train) + warm}
    assert [t.id for t in fresh_compositions(40, 0, ev, warm)] == [t.id for t in fresh]  # deterministic
    with pytest.raises(ValueError, match="rollout_composed and tasks.rollout_demo_tasks_only"):
        load_config(TrainConfig, None, ["tasks.rollout_composed=8", "tasks.rollout_demo_tasks_only=true"])


def test_composed_tasks_rendered_multi_turn_by_fraction(local):
    """stages.warm_start.composed_multi_turn: the first fraction of the composed tasks also get the multi-turn
    rendering (the agent loop's prompt), the rest single-turn only; the training tasks always both. (One
    demonstration per task: the local preset's variants are [compact].)"""
    from cuda_agent.corpus import composed_tasks
    from cuda_agent.stage_worker import demo_sequences

    cfg, train, ev, chat = local
    train = train[:6]
    comp = composed_tasks(10, 0, ev)
    counts = {}
    for frac in (0.0, 0.25, 0.3, 1.0):
        c = load_config(TrainConfig, CONFIGS / "local.yaml", [f"stages.warm_start.composed_multi_turn={frac}"])
        seqs, info = demo_sequences(c, chat, train, "cpu", comp)
        multi = sorted(s.episode_id.split("-")[1] for s in seqs if s.episode_id.endswith("-multi_turn"))
        counts[frac] = (len(seqs), multi, info["demos/composed_multi_turn_tasks"])
    demo_train = {t.id for t, _ in demos_for(train, "cpu", tuple(cfg.stages.warm_start.variants))}
    assert counts[0.0][1] == sorted(demo_train) and counts[0.0][2] == 0
    assert counts[0.3][1] == sorted(demo_train | {t.id for t in comp[:3]}) and counts[0.3][2] == 3
    assert counts[0.25][2] == 2  # round(2.5): half to even, as the docstring says
    assert counts[1.0][2] == 10 and counts[1.0][0] == counts[0.0][0] + 10
    with pytest.raises(ValueError, match="composed_multi_turn must be in"):
        load_config(TrainConfig, None, ["stages.warm_start.composed_multi_turn=1.5"])
