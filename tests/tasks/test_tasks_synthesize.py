"""Synthesis pipeline (resume after an interruption), near-duplicate and contamination checks, diversity."""

import json
import random

import pytest
from typer.testing import CliRunner

from cuda_agent import cli
from tasks.dedup import DedupIndex, benchmark_index, normalized_tokens, signature_of
from tasks.diversity import diversity_report
from tasks.filtering import FilterConfig
from tasks.graph import Builder
from tasks.loaders import load_jsonl
from tasks.operators import SizeProfile, by_name, start_value
from tasks.schema import Task
from tasks.synthesize import SynthesisConfig, Synthesizer, state_path


def _fast_filter(**kw):
    return FilterConfig(check_compile=False, warm_compile=False, workers=2, autosize=True,
                        min_reps=2, max_reps=5, timing_budget_s=0.05, **kw)


class _Stop(Exception):
    pass


@pytest.mark.slow
def test_synthesize_resumes_after_interruption(tmp_path):
    out = tmp_path / "set.jsonl"
    cfg = SynthesisConfig(n=5, out=str(out), seed=21, filter=_fast_filter())

    def stop_after_2(rep):
        if rep.accepted >= 2:
            raise _Stop

    with pytest.raises(_Stop):
        Synthesizer(cfg).run(on_progress=stop_after_2)
    first = load_jsonl(out)
    state1 = [json.loads(line) for line in state_path(out).read_text().splitlines()]
    assert len(first) == 2 and len(state1) >= 2

    rep = Synthesizer(SynthesisConfig(n=5, out=str(out), seed=21, filter=_fast_filter())).run()
    final = load_jsonl(out)
    state2 = [json.loads(line) for line in state_path(out).read_text().splitlines()]
    assert rep.accepted == 5 and len(final) == 5 and rep.resumed_from == len(state1)
    assert [t.id for t in final[:2]] == [t.id for t in first]  # earlier work kept
    idx = [r["index"] for r in state2]
    assert len(idx) == len(set(idx))  # no candidate index filtered twice
    assert len({t.id for t in final}) == 5
    assert sum(r["accepted"] for r in state2) == 5
    for t in final:
        assert t.metadata["eager_ms"] >= 0.1 and t.metadata["signature"] and t.source == "synthesized"
        assert t.metadata["filter_device"] == "cpu"


def test_near_duplicates_within_a_set():
    src = '''import torch\nimport torch.nn as nn\nn = 8\nclass Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\ndef get_inputs():\n    return [torch.randn(n, n)]\ndef get_init_inputs():\n    return []\n'''
    idx = DedupIndex()
    idx.add("a", ("relu",), src)
    assert idx.find(("relu",), src).reason == "identical"
    renamed = src.replace("n = 8", "size = 16").replace("(n, n)", "(size, size)") + "# comment\n"
    m = idx.find(("relu",), renamed)
    assert m.reason == "same_ops" and m.key == "a"
    other = src.replace("torch.relu(x)", "torch.sigmoid(x) * x")
    assert idx.find(("sigmoid", "mul"), other) is None  # different ops, similar boilerplate: kept
    # near-verbatim copy with a different op sequence is still caught by source similarity
    copy = src.replace("torch.relu(x)", "torch.relu(x) + 0")
    idx2 = DedupIndex(source_similarity=0.85)
    idx2.add("a", ("relu",), src)
    assert idx2.find(("relu", "add"), copy).reason == "similar_source"
    assert "NUM" in normalized_tokens("class Model:\n    k = 3\n") and "# comment" not in " ".join(normalized_tokens(renamed))


def test_contamination_against_kernelbench_fixture(kb_fixture):
    """Our rendering of conv2d -> relu -> bias add matches the fixture's level-2 task of the same ops."""
    bench = benchmark_index(kb_fixture)
    assert len(bench) == 9
    b = Builder()
    rng = random.Random(0)
    x = start_value(b, "nchw", rng)
    for name in ("conv2d", "relu", "bias_add"):
        x = by_name()[name].apply(b, x, rng, SizeProfile())
    src = b.render("conv2d -> relu -> bias_add")
    m = bench.find(signature_of(src), src)
    assert m is not None and m.key == "kb_l2_1_conv2d_relu_biasadd" and m.reason == "same_ops"
    # a different composition is not flagged
    b2 = Builder()
    x = start_value(b2, "nchw", rng)
    for name in ("conv2d", "gelu", "max_pool2d"):
        x = by_name()[name].apply(b2, x, rng, SizeProfile())
    src2 = b2.render("conv2d -> gelu -> max_pool2d")
    assert bench.find(signature_of(src2), src2) is None


def test_diversity_report_checks_the_goals():
    def t(i, cat, depth):
        return Task(id=f"t{i}", name="x", reference="x", category=cat, operators=("a",) * depth)

    good = [t(i, f"c{i % 7}", 2 + i % 4) for i in range(28)]
    rep = diversity_report(good)
    assert rep.ok and len(rep.categories) == 7 and set(rep.depths) == {2, 3, 4, 5}
    skewed = good + [t(100 + i, "c0", 3) for i in range(20)]
    assert any("holds" in p for p in diversity_report(skewed).problems)
    few = [t(i, f"c{i % 3}", 2 + i % 4) for i in range(12)]
    assert any("categories" in p for p in diversity_report(few).problems)
    shallow = [t(i, f"c{i % 7}", 2) for i in range(14)]
    assert any("depth" in p for p in diversity_report(shallow).problems)


@pytest.mark.slow
def test_filter_command_drops_duplicates_and_contaminated(tmp_path, kb_fixture, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    cli._mount()
    src = (kb_fixture / "level1" / "19_ReLU.py").read_text()
    rows = [
        Task(id="relu_a", name="a", reference=src.replace("dim = 1024", "dim = 2048")),
        Task(id="relu_b", name="b", reference=src.replace("dim = 1024", "dim = 4096")),
        Task(id="zeros", name="z", reference=src.replace("torch.relu(x)", "x * 0")),
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
    args = ["tasks", "filter", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out.jsonl"), "--no-compile",
            "--no-timing", "--workers", "1", "--rejected", str(tmp_path / "rej.jsonl")]
    r = CliRunner().invoke(cli.app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert [t.id for t in load_jsonl(tmp_path / "out.jsonl")] == ["relu_a"]
    rej = {j["task_id"]: j["reason"] for j in map(json.loads, (tmp_path / "rej.jsonl").read_text().splitlines())}
    assert rej == {"relu_b": "near_duplicate", "zeros": "zero_output"}
    assert "near_duplicate" in r.output and "zero_output" in r.output
    r = CliRunner().invoke(cli.app, args + ["--benchmark", str(kb_fixture)], catch_exceptions=False)
    assert r.exit_code == 0 and load_jsonl(tmp_path / "out.jsonl") == []
    rej = {j["task_id"]: j["reason"] for j in map(json.loads, (tmp_path / "rej.jsonl").read_text().splitlines())}
    assert rej["relu_a"] == "contaminated"
