"""Trajectories -> update rows (packing), the loss mask against the chat rendering on a 200-turn episode, and
the bounded buffer with the staleness rule."""

from __future__ import annotations

import numpy as np
import pytest

from learner import ppo
from learner.batch import leave_one_out_baselines, pack_trajectories, reward_stats
from learner.buffer import TrajectoryBuffer
from learner.chat import ChatFormat, ChatTokens, Message
from learner.tokenizer import train_bpe
from protocol.trajectory import Trajectory


def make_traj(i: int, n: int, rng, version: int = 0, reward: float = 1.0) -> Trajectory:
    mask = np.zeros(n, np.uint8)
    k = 1
    while k < n:  # alternating observation / policy spans, first token a prompt token
        span = int(rng.integers(1, 6))
        if rng.random() < 0.5:
            mask[k : k + span] = 1
        k += span
    if not mask.any():
        mask[n - 1] = 1
    return Trajectory(
        episode_id=f"ep{i}", task_id="t", actor_id="a", policy_version=version,
        tokens=rng.integers(0, 100, n).astype(np.int32),
        behaviour_logprobs=np.where(mask > 0, -rng.random(n), 0).astype(np.float32),
        loss_mask=mask, turn_boundaries=np.zeros(0, np.int32), reward=reward,
    )


def test_packing_places_every_trajectory_and_keeps_gae_per_trajectory():
    rng = np.random.default_rng(0)
    L = 64
    trajs = [make_traj(i, int(rng.integers(4, 60)), rng, reward=float(rng.integers(-1, 4))) for i in range(23)]
    trajs.append(make_traj(99, 80, rng))  # too long
    bad = make_traj(98, 10, rng)
    trajs.append(Trajectory(episode_id="ep98", task_id="t", actor_id="a", policy_version=0, tokens=bad.tokens,
                            behaviour_logprobs=bad.behaviour_logprobs, loss_mask=np.zeros(10, np.uint8),
                            turn_boundaries=np.zeros(0, np.int32), reward=0.0))
    packed, refused = pack_trajectories(trajs, L, rows_multiple=4, pack=True)
    assert sorted(refused) == [("ep98", "no_policy_tokens"), ("ep99", "too_long")]
    unpacked, _ = pack_trajectories(trajs, L, rows_multiple=4, pack=False)
    assert packed.num_rows % 4 == 0 and packed.num_rows < unpacked.num_rows == 24
    assert packed.num_tokens == unpacked.num_tokens == sum(len(t.tokens) for t in trajs[:23])

    seg_seen = set()
    for t, (row, start), eid in zip(trajs[:23], packed.placement, packed.episode_ids):
        assert eid == t.episode_id
        n = len(t.tokens)
        sl = slice(start, start + n)
        np.testing.assert_array_equal(packed.tokens[row, sl], t.tokens)
        np.testing.assert_array_equal(packed.loss_mask[row, sl], t.loss_mask)
        np.testing.assert_array_equal(packed.positions[row, sl], np.arange(n))
        np.testing.assert_allclose(packed.behaviour_logprobs[row, sl], t.behaviour_logprobs)
        seg = packed.segment_ids[row, sl]
        assert np.all(seg == seg[0]) and seg[0] > 0 and (row, seg[0]) not in seg_seen
        seg_seen.add((row, seg[0]))
        last = np.nonzero(t.loss_mask)[0][-1]
        assert packed.rewards[row, start + last] == t.reward
        assert np.count_nonzero(packed.rewards[row, sl]) == (t.reward != 0)
    assert np.all(packed.loss_mask[packed.segment_ids == 0] == 0)

    # GAE on packed rows == GAE of each trajectory alone in its own row
    values = rng.normal(size=packed.tokens.shape).astype(np.float32)
    adv, _ = ppo.gae(packed.rewards, values, packed.loss_mask, 0.99, 0.9, packed.segment_ids)
    adv = np.asarray(adv)
    alone_in = np.zeros((4, 23, L), np.float32)  # rewards, values, mask, segment ids; one row per trajectory
    for i, (t, (row, start)) in enumerate(zip(trajs[:23], packed.placement)):
        n = len(t.tokens)
        for j, src in enumerate((packed.rewards, values, packed.loss_mask)):
            alone_in[j, i, :n] = src[row, start : start + n]
        alone_in[3, i, :n] = 1
    alone, _ = ppo.gae(alone_in[0], alone_in[1], alone_in[2], 0.99, 0.9, alone_in[3].astype(np.int32))
    for i, (t, (row, start)) in enumerate(zip(trajs[:23], packed.placement)):
        n = len(t.tokens)
        np.testing.assert_allclose(adv[row, start : start + n], np.asarray(alone)[i, :n], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="no usable trajectory"):
        pack_trajectories(trajs[-2:], L)


def test_row_length_is_the_halving_that_wastes_the_least_padding():
    from learner.batch import pick_row_len

    # the H200 case: 32 trajectories of about 2,000 tokens, 16-row minibatches, rows of up to 16,384 tokens
    rng = np.random.default_rng(1)
    lengths = [int(x) for x in rng.integers(1500, 2400, 32)]
    L = pick_row_len(lengths, 16384, 1024, rows_multiple=16)
    assert L == 4096  # 16 rows x 4,096: two trajectories a row (16 x 16,384 at full length; 32 x 2,048 at half)
    # brute force over every halving: the pick has the fewest padded positions, ties to the longer row
    def padded(row_len):
        used = []
        for n in sorted(lengths, reverse=True):
            for r, u in enumerate(used):
                if u + n <= row_len:
                    used[r] += n
                    break
            else:
                used.append(n)
        return -(-len(used) // 16) * 16 * row_len
    costs = {c: padded(c) for c in (16384, 8192, 4096)}
    assert costs[L] == min(costs.values()) and costs[16384] == 4 * costs[4096]
    assert pick_row_len(lengths, 16384, 16384, rows_multiple=16) == 16384  # min_row_len = max_seq_len: fixed
    assert pick_row_len([3000], 16384, 1024) == 4096  # never shorter than the longest sequence
    assert pick_row_len([10, 10], 64, 1, rows_multiple=1) == 32  # one row either way: the shorter one costs less

    trajs = [make_traj(i, n, rng) for i, n in enumerate(lengths)]
    packed, refused = pack_trajectories(trajs, 16384, rows_multiple=16, min_row_len=1024)
    assert not refused and packed.tokens.shape == (16, 4096)
    assert packed.num_tokens == sum(lengths)
    for t, (row, start) in zip(trajs, packed.placement):
        np.testing.assert_array_equal(packed.tokens[row, start : start + len(t.tokens)], t.tokens)


CORPUS = [
    "write the kernel, compile it and check the speed-up against torch.compile",
    "the build failed: expected ';' before '}' token at line 12",
    "verification passed on 5 random inputs; eager 1.20 ms, compiled 0.95 ms, yours 0.80 ms",
    "def forward(self, x): return torch.relu(x @ self.w + self.b)",
    "__global__ void add(float* y, const float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; }",
] * 20


def test_loss_mask_agrees_with_chat_rendering_over_200_turns():
    tok = train_bpe(CORPUS, vocab_size=400, min_frequency=2)
    chat = ChatFormat(tok)
    rng = np.random.default_rng(3)
    prompt = [Message("system", "You write CUDA kernels."), Message("user", "Make Model faster.")]
    record = ChatTokens(chat, prompt)
    messages = list(prompt)
    turn_texts = []
    for k in range(200):
        text = CORPUS[int(rng.integers(0, 5))][: int(rng.integers(5, 40))] + f" turn {k}"
        sampled = tok.encode(text) + [tok.im_end_id]
        record.add_sampled(sampled, list(-rng.random(len(sampled))))
        messages.append(Message("assistant", text))
        turn_texts.append(text)
        if k < 199:
            obs = [Message("tool", CORPUS[int(rng.integers(0, 5))] + f" result {k}")]
            record.add_observation(obs)
            messages.extend(obs)
    ids, mask, logprobs = record.arrays()
    rendered = chat.render(messages)
    # the actor's token record is exactly the chat rendering, loss mask included
    np.testing.assert_array_equal(ids, rendered.ids)
    np.testing.assert_array_equal(mask, rendered.loss_mask)

    traj = Trajectory(episode_id="e", task_id="t", actor_id="a", policy_version=0, tokens=ids,
                      behaviour_logprobs=logprobs, loss_mask=mask.astype(np.uint8),
                      turn_boundaries=np.zeros(0, np.int32), reward=3.0)
    packed, refused = pack_trajectories([traj], max_seq_len=len(ids) + 50)
    assert not refused
    row_mask = packed.loss_mask[0, : len(ids)] > 0
    # the trained tokens, span by span, decode to the assistant turns (content + <|im_end|>), nothing else
    spans = np.split(np.arange(len(ids))[row_mask], np.nonzero(np.diff(np.arange(len(ids))[row_mask]) > 1)[0] + 1)
    assert len(spans) == 200
    for span, text in zip(spans, turn_texts):
        assert ids[span[-1]] == tok.im_end_id
        assert tok.decode(ids[span[:-1]].tolist()) == text
        assert np.all(packed.behaviour_logprobs[0, span] < 0)
    # credit: gamma = lam = 1, V = 0 -> every assistant token of all 200 turns carries the final reward
    adv, _ = ppo.gae(packed.rewards, np.zeros_like(packed.rewards), packed.loss_mask, 1.0, 1.0, packed.segment_ids)
    adv = np.asarray(adv)[0, : len(ids)]
    np.testing.assert_allclose(adv[row_mask], 3.0)
    assert np.all(adv[~row_mask] == 0)


def test_buffer_bound_duplicates_and_staleness():
    rng = np.random.default_rng(1)
    buf = TrajectoryBuffer(capacity=5, max_policy_lag=2)
    trajs = [make_traj(i, 8, rng, version=v) for i, v in enumerate([0, 1, 2, 3, 4, 5])]
    assert all(buf.add(t) for t in trajs[:5])
    assert not buf.add(trajs[5]) and buf.stats["refused_full"] == 1
    assert not buf.add(trajs[0]) and buf.stats["duplicates"] == 1
    # at learner version 4, versions 0 and 1 are more than 2 behind: dropped and counted
    got = buf.take(2, current_version=4)
    assert [t.policy_version for t in got] == [2, 3]
    assert buf.stats["dropped_stale"] == 2 and dict(buf.lags) == {2: 1, 1: 1}
    assert len(buf) == 1 and buf.free == 4
    assert buf.add(trajs[0])  # its id left the buffer: it may come back (the spool dedups for good)
    assert buf.take(10, current_version=4) == [trajs[4]] and buf.stats["dropped_stale"] == 3
    with pytest.raises(ValueError, match="capacity"):
        TrajectoryBuffer(0, 1)


def test_reward_stats():
    s = reward_stats(np.array([-1, 0, 3, 3], np.float32))
    assert s["reward/mean"] == 1.25 and s["reward/frac_3"] == 0.5 and s["reward/frac_neg1"] == 0.25
    assert s["reward/min"] == -1 and s["reward/count"] == 4


def test_leave_one_out_baselines_against_a_plain_loop():
    rng = np.random.default_rng(3)
    rewards = rng.integers(-1, 4, 30).astype(float)
    groups = [f"task{int(g)}" for g in rng.integers(0, 9, 30)]
    groups[-1] = "alone"  # one trajectory with no other of its task
    base, singletons = leave_one_out_baselines(rewards, groups)
    expect = []
    for i, g in enumerate(groups):
        mates = [rewards[j] for j in range(len(groups)) if j != i and groups[j] == g]
        others = [rewards[j] for j in range(len(groups)) if j != i]
        expect.append(np.mean(mates) if mates else np.mean(others))
    np.testing.assert_allclose(base, expect, rtol=1e-6)
    assert base.dtype == np.float32 and singletons == sum(groups.count(g) == 1 for g in groups) >= 1
    # a group whose rewards are all equal: advantage (reward - baseline) 0 for each of its trajectories
    b, n = leave_one_out_baselines([-1.0, -1.0, -1.0, 0.0, 2.0], ["a", "a", "a", "b", "b"])
    np.testing.assert_allclose(np.asarray([-1.0, -1.0, -1.0, 0.0, 2.0]) - b, [0, 0, 0, -2, 2])
    assert n == 0
    assert leave_one_out_baselines([3.0], ["a"])[0].tolist() == [0.0]
    with pytest.raises(ValueError, match="one length"):
        leave_one_out_baselines([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="no trajectory"):
        leave_one_out_baselines([], [])


def test_group_advantages_on_packed_rows_are_reward_less_baseline_on_every_policy_token():
    from learner.config import PPOConfig
    from learner.train_step import compute_advantages

    rng = np.random.default_rng(4)
    trajs = []
    for i in range(12):
        t = make_traj(i, int(rng.integers(6, 30)), rng, reward=float(rng.integers(-1, 3)))
        trajs.append(Trajectory(episode_id=t.episode_id, task_id=f"task{i % 4}", actor_id="a", policy_version=0,
                                tokens=t.tokens, behaviour_logprobs=t.behaviour_logprobs, loss_mask=t.loss_mask,
                                turn_boundaries=t.turn_boundaries, reward=t.reward))
    packed, _ = pack_trajectories(trajs, 64, rows_multiple=2, group_baselines=True)
    base, _ = leave_one_out_baselines([t.reward for t in trajs], [t.task_id for t in trajs])
    rollout = packed.to_rollout()
    values = rng.normal(size=packed.tokens.shape).astype(np.float32)  # ignored by the group advantage
    cfg = PPOConfig(baseline="group", normalize_advantages=False, lam=0.9)
    adv, _, ret = compute_advantages(rollout, values, cfg)
    _, ret_critic = ppo.gae(packed.rewards, values, packed.loss_mask, cfg.gamma, cfg.lam, packed.segment_ids)
    np.testing.assert_allclose(ret, ret_critic, rtol=1e-6)  # the critic still learns the GAE returns
    for i, (t, (row, start)) in enumerate(zip(trajs, packed.placement)):
        sl = slice(start, start + len(t.tokens))
        m = t.loss_mask > 0
        np.testing.assert_allclose(np.asarray(adv)[row, sl][m], t.reward - base[i], rtol=1e-6, atol=1e-6)
        assert np.all(np.asarray(adv)[row, sl][~m] == 0) and np.all(packed.baselines[row, sl][~m] == 0)
    assert np.all(np.asarray(adv)[packed.segment_ids == 0] == 0)
    # discounted (gamma < 1, several turns): a trajectory whose reward equals its baseline has 0 on every token
    # (the baseline is discounted like the reward), and the normalised advantages are scaled, not centred, so a
    # group of equal rewards stays at 0 beside a group that differs
    eq = [Trajectory(episode_id=f"eq{i}", task_id="same" if i < 2 else "mixed", actor_id="a", policy_version=0,
                     tokens=t.tokens, behaviour_logprobs=t.behaviour_logprobs, loss_mask=t.loss_mask,
                     turn_boundaries=t.turn_boundaries, reward=r)
          for i, (t, r) in enumerate(zip(trajs, [2.0, 2.0, 1.0, -1.0]))]
    eqp, _ = pack_trajectories(eq, 64, rows_multiple=2, group_baselines=True)
    for normalize in (False, True):
        c = PPOConfig(baseline="group", normalize_advantages=normalize, gamma=0.9)
        raw, used, _ = compute_advantages(eqp.to_rollout(), np.zeros(eqp.tokens.shape, np.float32), c)
        for i, (t, (row, start)) in enumerate(zip(eq, eqp.placement)):
            a = np.asarray(used)[row, start:start + len(t.tokens)][t.loss_mask > 0]
            if i < 2:
                np.testing.assert_allclose(a, 0.0, atol=1e-6)
            else:  # gamma^k (R - b), k the policy tokens after this one
                k = np.arange(len(a))[::-1]
                expect = 0.9 ** k * (t.reward - (eq[5 - i].reward))
                scale = 1.0 if not normalize else np.asarray(used)[row, start:start + len(t.tokens)][
                    t.loss_mask > 0][-1] / expect[-1]
                np.testing.assert_allclose(a, expect * scale, rtol=1e-5, atol=1e-6)
                assert scale > 0
    plain, _ = pack_trajectories(trajs, 64, rows_multiple=2)
    assert plain.baselines is None
    with pytest.raises(ValueError, match="group baselines"):
        compute_advantages(plain.to_rollout(), values, cfg)
    with pytest.raises(ValueError, match="baseline must be one of"):
        PPOConfig(baseline="grpo")
