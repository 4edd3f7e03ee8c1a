"""Seed operator mining and composition: counts, validity in eager, determinism, readable output."""

import ast
import collections

import pytest

from tasks import reference as ref
from tasks.categories import CATEGORIES
from tasks.compose import ComposeConfig, ComposeError, GraphComposer
from tasks.mining import enumerate_torch, mine
from tasks.operators import REGISTRY, by_name
from tasks.validate import check_runtime


def test_miner_reports_enumerated_and_drivable():
    rep = mine()
    assert rep.n_enumerated > 1000  # torch 2.4+ exposes well over a thousand public operators
    assert set(rep.enumerated) == {"torch.nn modules", "torch.nn.functional", "torch", "torch.linalg",
                                   "torch.Tensor methods"}
    assert "torch.nn.Conv2d" in rep.enumerated["torch.nn modules"]
    assert "torch.nn.functional.gelu" in rep.enumerated["torch.nn.functional"]
    assert rep.failed == {}, rep.failed
    assert len(rep.drivable_ops) >= 60 and len(rep.drivable_torch) >= 60
    assert len(rep.by_category) >= 8 and set(rep.by_category) <= set(CATEGORIES)
    assert "drivable" in rep.summary()


def test_miner_flags_an_operator_this_torch_lacks():
    op = by_name()["relu"]
    fake = type(op)(**{**op.__dict__, "name": "nope", "torch_name": "torch.nn.functional.no_such_op"})
    rep = mine(registry=(op, fake))
    assert rep.drivable_ops == ["relu"] and "does not exist" in rep.failed["nope"]


def test_registry_entries_resolve_to_enumerated_names():
    known = {n for names in enumerate_torch().values() for n in names}
    assert all(op.torch_name in known for op in REGISTRY)
    assert len({op.name for op in REGISTRY}) == len(REGISTRY)


def test_every_composed_task_runs_in_eager():
    comp = GraphComposer(ComposeConfig(seed=7))
    depths = collections.Counter()
    cats = collections.Counter()
    for i in range(160):
        cat = comp.categories[i % len(comp.categories)]
        t = comp.compose(i, category=cat)
        assert t.category == cat and 2 <= len(t.operators) <= 5
        depths[len(t.operators)] += 1
        cats[cat] += 1
        # Valid by construction: it runs, the declared shape params are its int constants, and the
        # rendered file is plain KernelBench format.
        info = check_runtime(t.reference, t.id, determinism=False)
        assert info.output_shapes is not None
        assert t.shape_params == ref.shape_params(t.reference)
        tree = ast.parse(t.reference)
        names = [getattr(n, "name", None) for n in tree.body]
        assert {"Model", "get_inputs", "get_init_inputs"} <= set(names)
    assert set(depths) == {2, 3, 4, 5}
    assert len(cats) == len(comp.categories) >= 8


def test_compose_is_deterministic_and_depth_can_be_forced():
    a = GraphComposer(ComposeConfig(seed=3)).compose(11, category="conv", depth=4)
    b = GraphComposer(ComposeConfig(seed=3)).compose(11, category="conv", depth=4)
    c = GraphComposer(ComposeConfig(seed=4)).compose(11, category="conv", depth=4)
    assert a.reference == b.reference and a.reference != c.reference
    assert len(a.operators) == 4 and a.provenance["composer"] == "graph"
    with pytest.raises(ValueError, match="unknown category"):
        GraphComposer().compose(0, category="quantum")


def test_shape_params_rescale_composed_tasks():
    """Doubling every shape parameter keeps a composed task valid (the GPU split relies on it)."""
    comp = GraphComposer(ComposeConfig(seed=5))
    for i in range(12):
        t = comp.compose(i, category=comp.categories[i % len(comp.categories)], depth=3)
        small = check_runtime(t.reference, t.id, determinism=False)
        big_src = ref.with_shape_params(t.reference, {k: v * 2 for k, v in t.shape_params.items()})
        big = check_runtime(big_src, t.id + "_x2", determinism=False)
        assert len(big.output_shapes) == len(small.output_shapes)


def test_impossible_request_raises_compose_error():
    # A chain never repeats an op back to back, so a conv2d-only registry has no 2-op composition.
    conv_only = tuple(op for op in REGISTRY if op.name == "conv2d")
    cfg = ComposeConfig(seed=0, max_attempts=3, min_depth=2, max_depth=2)
    with pytest.raises(ComposeError, match="no valid composition"):
        GraphComposer(cfg, registry=conv_only).compose(0)
    with pytest.raises(ValueError, match="unknown category"):
        GraphComposer(cfg, registry=conv_only).compose(0, category="matmul")
    # A parameter limit no Linear layer fits in.
    lin = tuple(op for op in REGISTRY if op.name in ("linear", "relu"))
    cfg.profile = type(cfg.profile)(features=(64,), channels=(8,), max_numel=1 << 20, max_params=10)
    with pytest.raises(ComposeError):
        GraphComposer(cfg, registry=lin).compose(0, category="matmul")
    cfg.profile = type(cfg.profile)()
    assert set(GraphComposer(cfg, registry=lin).compose(0, category="matmul").operators) == {"linear", "relu"}
