"""`cuda-agent tasks import / list / show` through the real Typer app."""

import json

import pytest
from typer.testing import CliRunner

from cuda_agent import cli


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_TASK_LIBRARY", str(tmp_path / "lib.jsonl"))
    monkeypatch.setenv("COLUMNS", "200")
    cli._mount()
    runner = CliRunner()

    def _run(*args):
        return runner.invoke(cli.app, ["tasks", *map(str, args)], catch_exceptions=False)

    return _run


def test_import_list_show(run, kb_fixture, tmp_path):
    r = run("import", kb_fixture)
    assert r.exit_code == 0, r.output
    assert "imported 9 task(s)" in r.output and (tmp_path / "lib.jsonl").exists()
    r = run("list", "--filter", "conv", "--from", tmp_path / "lib.jsonl")
    assert r.exit_code == 0 and "2 task(s)" in r.output and "kb_l2_1_conv2d_relu_biasadd" in r.output
    r = run("list", "--filter", "conv", "--from", tmp_path / "lib.jsonl", "--json")
    rows = [json.loads(line) for line in r.output.splitlines()]
    assert r.exit_code == 0 and len(rows) == 2 and "kb_l2_1_conv2d_relu_biasadd" in {x["id"] for x in rows}
    assert all(set(x) == {"id", "name", "source", "level", "category", "operators", "shape_params"} for x in rows)
    r = run("show", "kb_l1_19_relu")
    assert r.exit_code == 0 and "torch.relu(x)" in r.output and "activation" in r.output
    r = run("show", "relu")
    assert r.exit_code == 1 and "did you mean: kb_l1_19_relu" in r.output


def test_import_rejects_invalid_with_named_file(run, tmp_path, good_source):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "ok.py").write_text(good_source)
    (folder / "bad.py").write_text(good_source.replace("return torch.relu(self.linear(x))", "return 3"))
    r = run("import", folder)
    assert r.exit_code == 1 and "bad.py: non_tensor_output" in r.output and "nothing imported" in r.output
    r = run("import", folder, "--keep-going")
    assert r.exit_code == 0 and "imported 1 task(s)" in r.output
