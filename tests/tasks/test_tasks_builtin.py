"""The shipped built-in splits: schema and eager checks on every task, compile + timing on a sample."""

import random

import pytest

from tasks import builtin
from tasks.dedup import DedupIndex
from tasks.diversity import diversity_report
from tasks.filtering import FilterConfig, filter_in_process
from tasks.reference import shape_params
from tasks.validate import check_runtime, check_static


@pytest.fixture(scope="module")
def splits():
    return {name: builtin.load_split(name) for name in builtin.SPLITS}


def test_split_sizes_and_unique_ids(splits):
    assert 18 <= len(splits["single_op"]) <= 30
    assert len(splits["cpu_train"]) + len(splits["cpu_eval"]) >= 90
    assert len(splits["gpu_train"]) + len(splits["gpu_eval"]) >= 60
    assert len(splits["cpu_eval"]) >= 15 and len(splits["gpu_eval"]) >= 10
    ids = [t.id for ts in splits.values() for t in ts]
    assert len(ids) == len(set(ids))
    with pytest.raises(ValueError, match="unknown split"):
        builtin.load_split("test")


def test_every_task_passes_schema_and_eager_checks(splits):
    """Static checks, declared shape params, and two deterministic eager runs (GPU tasks at CPU size)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tasks were sized for one thread; two shared cores only add contention
    for name, tasks in splits.items():
        for t in tasks:
            check_static(t.reference, t.id)
            assert t.shape_params == shape_params(t.reference), t.id
            small = builtin.at_cpu_size(t)
            info = check_runtime(small.reference, t.id, determinism=True)
            if "output_shapes" in t.metadata and name.startswith("cpu"):
                assert info.output_shapes == t.metadata["output_shapes"], t.id
    torch.set_num_threads(threads)


def test_gpu_tasks_carry_their_h200_measurement(splits):
    """The GPU split as measured on an H200 by the filter (tasks.builtin.measure_gpu): eager times in the 1-100 ms
    window, the roofline estimate kept beside them, and the measurement recorded in the manifest."""
    import json

    manifest = json.loads((builtin.HERE / "MANIFEST.json").read_text())
    assert manifest["gpu_measured"]["counts"] == {"gpu_eval": len(splits["gpu_eval"]),
                                                  "gpu_train": len(splits["gpu_train"])}
    for t in splits["gpu_train"] + splits["gpu_eval"]:
        m = t.metadata
        assert m["size"] == "gpu" and m["gpu_timing_status"] in ("measured", "contended"), t.id
        assert m["eager_ms_source"] == "measured" and "H200" in m["gpu_name"], t.id
        assert 1.0 <= m["eager_ms"] <= 100.0 and m["compile_ms"] > 0, t.id
        assert 1.5 <= m["eager_ms_estimate_h200"] <= 50
        assert m["footprint_bytes"] <= 16 << 30
        assert set(m["cpu_shape_params"]) == set(t.shape_params)
        assert any(t.shape_params[k] > v for k, v in m["cpu_shape_params"].items())
        assert t.id not in manifest["gpu_measured"]["dropped"]


def test_cpu_tasks_were_timed_in_the_window(splits):
    for t in splits["cpu_train"] + splits["cpu_eval"]:
        assert 0.1 <= t.metadata["eager_ms"] <= 20.0 and t.metadata["compile_ms"] > 0


def test_diversity_and_eval_separation(splits):
    for kind in ("cpu", "gpu"):
        tasks = splits[f"{kind}_train"] + splits[f"{kind}_eval"]
        rep = diversity_report(tasks)
        assert rep.ok, rep.problems
    train = [t for s in builtin.TRAIN_SPLITS for t in splits[s]]
    idx = DedupIndex()
    for t in train:
        idx.add(t.id, t.metadata.get("signature", ()), t.reference)
    for s in builtin.EVAL_SPLITS:
        for t in splits[s]:
            m = idx.find(t.metadata.get("signature", ()), t.reference)
            assert m is None, (t.id, m)


@pytest.mark.slow
def test_compile_and_timing_on_a_sample(splits):
    """torch.compile + timing on 3 CPU tasks and 1 GPU task at CPU size (the full set was checked at build)."""
    rng = random.Random(0)
    sample = rng.sample(splits["cpu_train"] + splits["cpu_eval"], 3)
    sample.append(builtin.at_cpu_size(rng.choice(splits["gpu_train"])))
    cfg = FilterConfig(eager_window_ms=[0.01, 200.0], min_reps=3, max_reps=10, timing_budget_s=0.2)
    for t, v in filter_in_process(sample, cfg):
        assert v.accepted, (t.id, v.reason, v.detail)
        assert v.compile_ms is not None


def test_single_op_categories_match_their_trace(splits):
    from tasks.categories import infer_category
    from tasks.trace import trace_source

    # written out with primitive ops (mean / vector norm), a trace sees a reduction; by hand they are norms
    by_hand = {"op_rmsnorm": "normalization", "op_l2normalize": "normalization"}
    for t in splits["single_op"]:
        traced = infer_category(trace_source(t.reference, t.id).signature)
        assert t.category == by_hand.get(t.id, traced), t.id
        if t.id in by_hand:
            assert traced == "reduction"


@pytest.mark.gpu
def test_gpu_split_sample_on_the_gpu(splits):
    """On an H200: a sample of the GPU split runs on CUDA, in the 1-100 ms eager window (the estimate's check).

    The whole split is measured with `cuda-agent tasks filter tasks/builtin/gpu_train.jsonl --device cuda
    --workers 1 --out measured.jsonl --rejected off_window.jsonl`.
    """
    rng = random.Random(1)
    sample = rng.sample(splits["gpu_train"], 3)
    cfg = FilterConfig(device="cuda", check_compile=False, min_reps=3, max_reps=10)
    for t, v in filter_in_process(sample, cfg):
        print(t.id, t.metadata["eager_ms_estimate_h200"], "estimated ms;", v.eager_ms, "measured ms")
        assert v.accepted, (t.id, v.reason, v.detail)


def test_family_splits_are_demonstration_family_compositions(splits):
    """cpu_family_*: every task is a composition the demonstration generator covers (training tasks have a
    compact demonstration; evaluation tasks get none), of the same operators, none shared between the two."""
    from tasks.builtin.build_family import FAMILY_OPS, in_family
    from tasks.demos import demonstrations

    train, ev = splits["cpu_family_train"], splits["cpu_family_eval"]
    assert len(train) >= 200 and len(ev) >= 20
    for t in train + ev:
        assert in_family(t.reference) and set(t.operators) <= FAMILY_OPS, t.id
    for t in train[:20]:
        assert any(d.variant == "compact" for d in demonstrations(t, ("cpu",))), t.id
    assert not {t.content_hash for t in train} & {t.content_hash for t in ev}
    train_ops = {op for t in train for op in t.operators}
    assert {op for t in ev for op in t.operators} <= train_ops  # nothing in eval that training never shows
    assert len({t.category for t in ev}) >= 5
