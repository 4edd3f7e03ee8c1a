"""`cuda-agent eval` against an OpenAI-compatible endpoint (a local test double of the external service) with a real
sandbox node on the CPU backend, and `cuda-agent sandbox eval` over a folder of solutions: both print the
KernelBench table from the same metrics function, with the device and torch version."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "corpus"


class ChatEndpoint:
    """A minimal chat-completions server: the reply is chosen by the task id in the first user message."""

    def __init__(self, replies: dict[str, str]):
        self.replies = replies
        self.requests = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests += 1
                user = next(m["content"] for m in body["messages"] if m["role"] == "user")
                task_id = re.match(r"Task (\S+):", user).group(1)
                msg = {"role": "assistant", "content": endpoint.replies[task_id]}
                data = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                   "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _solution_reply(folder: Path) -> str:
    from learner.chat import format_tool_call

    calls = [format_tool_call("write_file", {"path": str(p.relative_to(folder)), "content": p.read_text()})
             for p in sorted(folder.rglob("*")) if p.is_file()]
    return "Here is my solution.\n" + "\n".join(calls)


def _corpus_task(name: str):
    from sandbox.files import load_task

    return load_task(CORPUS / name)


@pytest.mark.slow
def test_eval_command_scores_an_endpoint_with_kernelbench_metrics(tmp_path):
    from tasks.loaders import write_jsonl

    tasks = [_corpus_task("cumsum"), _corpus_task("row_stats"), _corpus_task("reduction")]
    write_jsonl(tasks, tmp_path / "tasks.jsonl")
    replies = {tasks[0].id: _solution_reply(CORPUS / "cumsum" / "cpu" / "fast"),
               tasks[1].id: _solution_reply(CORPUS / "row_stats" / "cpu" / "wrong"),
               tasks[2].id: "I cannot do this one."}  # no tool call: nothing written, the episode fails
    ep = ChatEndpoint(replies)
    out = tmp_path / "out"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "cuda_agent.cli", "eval", "--openai-url", ep.url, "--openai-model", "fake-model",
             "--tasks", str(tmp_path / "tasks.jsonl"), "--out", str(out), "--quiet", "--concurrency", "3",
             "--sandbox-opt", "sandbox.use_compile=false", "--sandbox-opt", "sandbox.reps=5",
             "--sandbox-opt", "sandbox.num_trials=2", "--sandbox-opt", "build_workers=1", "--sandbox-workers", "1"],
            cwd=REPO, capture_output=True, text=True, timeout=600)
    finally:
        ep.close()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ep.requests == 3
    payload = json.loads((out / "metrics.json").read_text())
    m = payload["metrics"]["overall"]
    assert m["samples"] == 3 and m["tasks"] == 3
    assert m["pass_rate"] == pytest.approx(1 / 3)  # only the correct cumsum kernel passes
    assert m["status_counts"].get("ok") == 1 and m["status_counts"].get("incorrect") == 1
    assert payload["per_task"][tasks[0].id]["status"] == "ok"
    assert payload["per_task"][tasks[1].id]["status"] == "incorrect"
    assert payload["environment"]["torch"].startswith("2.") and payload["policy"].startswith("openai:fake-model")
    assert m["geomean_speedup_eager"] is not None and m["geomean_speedup_eager"] > 0
    assert "| all |" in (out / "metrics.md").read_text()
    assert "KernelBench metrics" in proc.stdout and "torch 2." in proc.stdout
    rows = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in rows} == {t.id for t in tasks}
    assert all(r["mode"] == "single_turn" for r in rows)


@pytest.mark.slow
def test_sandbox_eval_folder_mode_prints_the_same_metrics(tmp_path):
    tasks_dir, sols = tmp_path / "tasks", tmp_path / "solutions"
    for name, variant in (("cumsum", "fast"), ("row_stats", "wrong")):
        shutil.copytree(CORPUS / name, tasks_dir / name, ignore=shutil.ignore_patterns("cpu", "cubin", "extension*"))
        shutil.copytree(CORPUS / name / "cpu" / variant, sols / name)
    out = tmp_path / "metrics"
    proc = subprocess.run(
        [sys.executable, "-m", "cuda_agent.cli", "sandbox", "eval", str(tasks_dir), str(sols), "--backend", "cpu",
         "--set", "use_compile=false", "--set", "reps=5", "--set", "num_trials=2", "--metrics-out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "KernelBench metrics" in proc.stdout
    m = json.loads((out / "metrics.json").read_text())["metrics"]
    assert m["overall"]["samples"] == 2 and m["overall"]["pass_rate"] == pytest.approx(0.5)
    # per level: cumsum is a level-1 task (correct kernel), row_stats a level-2 one (wrong kernel)
    assert m["levels"]["1"]["pass_rate"] == 1.0 and m["levels"]["2"]["pass_rate"] == 0.0


@pytest.mark.parametrize("args, named", [
    (["--samples", "0"], "--samples"),
    (["--format", "bogus"], "solution_format"),
    (["agent.nosuch=1"], "nosuch"),
    (["--temperature", "-1"], "temperature"),
])
def test_eval_refuses_bad_settings_before_starting_anything(tmp_path, args, named):
    from typer.testing import CliRunner

    from cuda_agent.cli import _mount, app

    _mount()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    out = tmp_path / "out"
    def text(r) -> str:  # rich's error box wraps lines
        return " ".join(r.output.replace("│", " ").split())

    r = CliRunner().invoke(app, ["eval", "--checkpoint", str(ckpt), "--out", str(out), *args])
    assert r.exit_code == 2 and named in text(r), r.output
    assert not out.exists()  # no node started, no run folder made
    r = CliRunner().invoke(app, ["eval", "--checkpoint", str(tmp_path / "absent"), "--out", str(out)])
    assert r.exit_code == 2 and "not a checkpoint folder" in text(r) and not out.exists()


def test_eval_args_of_a_run_parse_as_the_eval_command_and_carry_its_settings(tmp_path):
    """cuda_agent.services.eval_args (what `cuda-agent train`'s evaluations and train_bench's sampled evaluations
    run): the eval command's own parser accepts them, with the run's evaluation settings and the overrides."""
    import typer.main

    from cuda_agent.config import load_config
    from cuda_agent.eval import eval_cmd
    from cuda_agent.services import eval_args
    from cuda_agent.train_config import TrainConfig

    cfg = load_config(TrainConfig, Path(__file__).resolve().parents[2] / "configs" / "local.yaml",
                      ["eval.mode=multi_turn", "eval.max_turns=2", "seed=7"])
    app = typer.Typer()
    app.command("eval")(eval_cmd)  # one command: the app is that command
    args = eval_args(cfg, tmp_path / "policy", tmp_path / "tasks.jsonl", tmp_path / "out", "cpu", samples=8,
                     temperature=0.6)
    p = typer.main.get_command(app).make_context("eval", [*args, "--sandbox-workers", "1"]).params
    assert (p["samples"], p["temperature"], p["max_turns"], p["fmt"], p["seed"]) == (8, 0.6, 2, "cpu", 7)
    assert p["multi_turn"] is True and f"agent.skill={cfg.actor.agent.skill}" in p["overrides"]
    again = eval_args(cfg, "p", "t", "o", "cpu")  # no overrides: the run's own samples and temperature
    assert again[again.index("--samples") + 1] == str(cfg.eval.samples_per_task)
    assert again[again.index("--temperature") + 1] == str(cfg.eval.temperature)
