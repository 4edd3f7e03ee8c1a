"""learner.model.packed_segments (the cuDNN packed-attention layout of packed rows) against a plain NumPy
reading of the segment ids, on the rows learner/batch.py builds and on rows it never builds."""

from __future__ import annotations

import numpy as np
import pytest

from learner.model import ModelConfig, packed_segments


def _reference(seg: np.ndarray, m: int):
    """Lengths / starts of ids 1..n per row, -1 padded; ok as packed_segments documents it."""
    b, t = seg.shape
    lens = -np.ones((b, m), np.int64)
    offs = -np.ones((b, m + 1), np.int64)
    ok = bool((seg > 0).any())
    for r in range(b):
        row = seg[r]
        n = int(row.max())
        ok &= n <= m
        nz = np.nonzero(row)[0]
        if n:
            ok &= bool((row[: nz[-1] + 1] > 0).all())  # padding only after the last segment
            ids = row[: nz[-1] + 1]
            ok &= ids[0] == 1 and bool(np.all(np.diff(ids) >= 0)) and bool(np.all(np.diff(ids) <= 1))
        for i in range(min(n, m)):
            where = np.nonzero(row == i + 1)[0]
            lens[r, i] = len(where)
            offs[r, i] = where[0] if len(where) else -1
    return lens, offs, ok


def _packed_row(rng, t: int, n: int) -> np.ndarray:
    cuts = np.sort(rng.choice(np.arange(1, t), n, replace=False))
    row = np.zeros(t, np.int32)
    start = 0
    for i, end in enumerate(cuts):
        row[start:end] = i + 1
        start = end
    return row  # the tail after the last cut is padding


@pytest.mark.parametrize("seed", range(6))
def test_packed_rows_match_numpy(seed):
    rng = np.random.default_rng(seed)
    t, m = 64, 8
    seg = np.stack([_packed_row(rng, t, int(rng.integers(1, m + 1))) for _ in range(3)])
    lens, offs, ok = (np.asarray(x) for x in packed_segments(seg, m))
    ref_lens, ref_offs, ref_ok = _reference(seg, m)
    assert ok and ref_ok
    np.testing.assert_array_equal(lens, ref_lens)
    np.testing.assert_array_equal(offs, ref_offs)
    # the layout covers exactly the non-padding tokens of each row
    for r in range(3):
        n = int(seg[r].max())
        assert lens[r, :n].sum() == np.count_nonzero(seg[r])
        np.testing.assert_array_equal(offs[r, 1:n], np.cumsum(lens[r, :n])[:-1])


def test_batch_builder_rows_are_packed_layout():
    """The rows learner/batch.py packs are the layout the packed path needs (so it is the path they take)."""
    from learner.batch import pack_trajectories
    from tests.learner.test_learner_batch import make_traj

    rng = np.random.default_rng(0)
    trajs = [make_traj(i, int(rng.integers(4, 60)), rng) for i in range(23)]
    packed, _ = pack_trajectories(trajs, 64, rows_multiple=4, pack=True)
    seg = np.asarray(packed.segment_ids)
    lens, offs, ok = packed_segments(seg, 64)
    assert bool(ok) and int(seg.max()) > 1
    ref_lens, ref_offs, _ = _reference(seg, 64)
    np.testing.assert_array_equal(np.asarray(lens), ref_lens)
    np.testing.assert_array_equal(np.asarray(offs), ref_offs)


@pytest.mark.parametrize("row, why", [
    ([1, 1, 0, 2, 2, 0], "padding between segments"),
    ([0, 1, 1, 1, 0, 0], "leading padding"),
    ([1, 1, 3, 3, 0, 0], "an id skipped"),
    ([1, 2, 1, 2, 0, 0], "a segment split in two"),
    ([2, 2, 2, 0, 0, 0], "first id not 1"),
    ([1, 2, 3, 4, 5, 6], "more segments than max_segments"),
    ([0, 0, 0, 0, 0, 0], "all padding"),
])
def test_other_layouts_are_refused(row, why):
    seg = np.asarray([row], np.int32)
    _, _, ok = packed_segments(seg, 4)
    assert not bool(ok), why
    assert not _reference(seg, 4)[2], why


def test_max_segments_validated():
    with pytest.raises(ValueError, match="attention_max_segments"):
        ModelConfig.tiny(attention_max_segments=1)
    assert ModelConfig.tiny(attention_max_segments=0).attention_max_segments == 0


def test_grouped_query_keys_are_repeated_where_jax_misplaces_their_offsets(monkeypatch):
    """jax <= 0.10.2 scales packed kv offsets by the query's heads (jax-ml/jax#39521): there the keys and values
    must reach cuDNN with as many heads as the queries; where jax is right they go as they are (GQA kept)."""
    import jax
    import jax.numpy as jnp
    from jax._src.cudnn import fused_attention_stablehlo as fa

    from learner import model as m

    if tuple(int(x) for x in jax.__version__.split(".")[:3]) <= (0, 10, 2):
        assert m.packed_kv_offsets_follow_key_heads() is False
    seen = []

    def fake(q, k, v, **kw):
        seen.append((k.shape[2], v.shape[2], np.asarray(k[0, 0, :, 0])))
        return jnp.zeros(q.shape, q.dtype)

    monkeypatch.setattr(fa, "dot_product_attention", fake)
    q = jnp.zeros((1, 4, 6, 8), jnp.bfloat16)
    k = jnp.asarray(np.arange(2, dtype=np.float32).reshape(1, 1, 2, 1) * np.ones((1, 4, 2, 8)), jnp.bfloat16)
    seqlens, offsets, _ = m.packed_segments(np.asarray([[1, 1, 2, 2]], np.int32), 4)
    for follows, heads in ((False, 6), (True, 2)):
        monkeypatch.setattr(m, "packed_kv_offsets_follow_key_heads", lambda f=follows: f)
        m._cudnn_packed_attention(q, k, k, seqlens, offsets)
        assert seen[-1][:2] == (heads, heads)
    np.testing.assert_array_equal(seen[0][2], [0, 0, 0, 1, 1, 1])  # query head h reads kv head h // 3
