"""`cuda-agent sandbox eval`: single task (readable / JSON), folder mode (table), exit codes."""

import json
import shutil

from typer.testing import CliRunner

from cuda_agent.cli import _mount, app

from sandbox_testlib import CORPUS

_mount()
runner = CliRunner()


def _args(tmp_path):
    return ["--backend", "cpu", "--set", "profile=false", "--set", f"cache_dir={tmp_path}/cache",
            "--set", "trial_timeout_s=5"]


def test_single_task_readable(tmp_path):
    r = runner.invoke(app, ["sandbox", "eval", str(CORPUS / "row_stats"), str(CORPUS / "row_stats" / "cpu" / "wrong"),
                            *_args(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "incorrect" in r.stdout and "reward -1" in r.stdout and "isolation" in r.stdout


def test_folder_mode_json(tmp_path):
    sols = tmp_path / "solutions"
    for t, v in (("cumsum", "fast"), ("matmul", "wrong")):
        shutil.copytree(CORPUS / t / "cpu" / v, sols / t)
    r = runner.invoke(app, ["sandbox", "eval", str(CORPUS), str(sols), "--json", *_args(tmp_path)])
    assert r.exit_code == 0, r.output
    rows = {d["task_id"]: (d["status"], d["reward"]) for d in json.loads(r.stdout)}
    assert rows == {"cumsum": ("ok", 0.0), "matmul": ("incorrect", -1.0)}


def test_usage_errors_exit_non_zero(tmp_path):
    assert runner.invoke(app, ["sandbox", "eval", str(tmp_path / "nope"), str(tmp_path)]).exit_code != 0
    r = runner.invoke(app, ["sandbox", "eval", str(CORPUS / "cumsum"), str(CORPUS / "cumsum" / "cpu" / "fast"),
                            "--backend", "cpu", "--format", "cubin"])
    assert r.exit_code != 0
    r = runner.invoke(app, ["sandbox", "eval", str(CORPUS / "cumsum"), str(CORPUS / "cumsum" / "cpu" / "fast"),
                            "--backend", "cpu", "--set", "reps=0"])
    assert r.exit_code != 0


def test_an_invalid_task_is_a_usage_error_before_anything_is_built(tmp_path):
    task = tmp_path / "no_model"
    task.mkdir()
    (task / "model.py").write_text("import torch\n\ndef get_inputs():\n    return [torch.randn(4)]\n")
    r = runner.invoke(app, ["sandbox", "eval", str(task), str(CORPUS / "cumsum" / "cpu" / "fast"), *_args(tmp_path)])
    assert r.exit_code == 2 and "no_model" in r.output, r.output
    assert not (tmp_path / "cache").exists()  # refused before the evaluator started
