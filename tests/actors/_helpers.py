"""Shared parts of the actor tests: a small task with our own CPU kernels, a tokenizer trained on the skill
text, a scripted policy (the test double of a model), and a sandbox node on the CPU backend."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from actors.sampler import FINISH_LENGTH, FINISH_STOP_TOKEN, Completion, SamplingParams
from actors.skill import system_prompt, task_prompt
from learner.chat import ChatFormat, format_tool_call
from learner.tokenizer import Tokenizer, train_bpe
from tasks.schema import Task

REFERENCE = '''\
import torch
import torch.nn as nn

rows = 256
cols = 4096


class Model(nn.Module):
    """Four elementwise passes over memory in eager mode; one fused pass is enough."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = torch.relu(x * 2.0 - 1.0)
        y = y * y + x
        return y / (1.0 + torch.abs(x))


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
'''

KERNEL = '''\
#include <math.h>

extern "C" void fused_chain(const float* __restrict__ x, float* __restrict__ out, long long n) {
#pragma omp simd
    for (long long i = 0; i < n; ++i) {
        float v = x[i] * 2.0f - 1.0f;
        v = v > 0.0f ? v : 0.0f;
        v = v * v + x[i];
        out[i] = v / (1.0f + fabsf(x[i]));
    }
}
'''

WRONG_KERNEL = KERNEL.replace("v = v * v + x[i];", "v = v * v - x[i];")

HOSTILE_KERNEL = '''\
#include <stdlib.h>

extern "C" void fused_chain(const float* x, float* out, long long n) {
    system("touch /tmp/actor-test-pwned");
    for (long long i = 0; i < n; ++i) out[i] = x[i];
}
'''

BROKEN_KERNEL = KERNEL.replace("float v = x[i]", "flot v = x[i]")

MODEL_NEW = '''\
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        K.fused_chain(x, out, x.numel())
        return out
'''


def make_task(name: str = "fused chain", task_id: str = "fused_chain") -> Task:
    """The test task. Tasks that differ only in `name` share sandbox results (the name is not in the node's
    content key), which the scripted policy uses to pick a script."""
    return Task(id=task_id, name=name, reference=REFERENCE, source="user", level=1, category="elementwise",
                shape_params={"rows": 256, "cols": 4096})


def call(name: str, **arguments) -> str:
    return format_tool_call(name, arguments)


def write(path: str, content: str) -> str:
    return call("write_file", path=path, content=content)


def make_tokenizer(vocab_size: int = 1024) -> Tokenizer:
    """A byte-level BPE trained on the skill text, the task and the solutions (fast: a few hundred ms)."""
    task = make_task()
    corpus = [system_prompt(f, m, 8, skill) for f in ("cpu", "cubin", "extension") for m in ("multi_turn", "single_turn")
              for skill in ("full", "brief")]
    corpus += [task_prompt(task, "cpu"), KERNEL, MODEL_NEW, write("model_new.py", MODEL_NEW)] * 4
    return train_bpe(corpus, vocab_size=vocab_size)


class ScriptedPolicy:
    """A test double of a model: replies with fixed texts. The script is picked by the task *name* in the
    episode's first user message ("Task <id>: <name> (...)") and the reply by the number of assistant turns
    so far; past the end of a script it repeats the last reply. Log-probs are -0.25 per token; a reply longer
    than max_new_tokens is cut (finish reason "length"), as a sampler would."""

    version = 1
    name = "scripted"

    def __init__(self, tokenizer: Tokenizer, scripts: dict[str, Sequence[str]], version: int = 1):
        self.tok = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.scripts = scripts
        self.version = version
        self.calls: list[int] = []  # batch size of each call

    def generate(self, prompts, settings: Sequence[SamplingParams]) -> list[Completion]:
        self.calls.append(len(prompts))
        out = []
        for prompt, sp in zip(prompts, settings):
            msgs = self.chat.parse(prompt)
            user = next(m.content for m in msgs if m.role == "user")
            name = re.match(r"Task \S+: (.+?) \(solution format", user).group(1)
            turn = sum(m.role == "assistant" for m in msgs)
            script = self.scripts[name]
            ids = self.tok.encode(script[min(turn, len(script) - 1)]) + [self.tok.im_end_id]
            reason = FINISH_STOP_TOKEN
            if len(ids) > sp.max_new_tokens:
                ids, reason = ids[:sp.max_new_tokens], FINISH_LENGTH
            out.append(Completion(ids, np.full(len(ids), -0.25, np.float32), reason))
        return out


def stages_for_tests(**changes):
    """Stages for the tests: `verify` runs with the node's own settings (a full evaluation) instead of the
    default `profile: false`. Each distinct settings set costs the node a trusted worker whose first confined
    candidate takes ~20 s to start on a 2-core machine; one set keeps the suite within its time budget."""
    from actors.config import StagesConfig

    return StagesConfig(**{"verify_settings": {}, "unavailable_after_s": 20.0, **changes})


def slow_kernel(functions: int = 400) -> str:
    """A correct cpu kernel file padded with many small functions, so that its -O3 build takes seconds (a job
    that is surely in flight when a test kills its node)."""
    parts = [KERNEL]
    for i in range(functions):
        parts.append(f"static float pad{i}(float x) {{ float s = x; for (int k = 0; k < {i % 5 + 2}; ++k) "
                     f"s = sinf(s) * 1.0001f + {i}.5f; return s; }}")
    parts.append('extern "C" void padding_sum(const float* x, float* out, long long n) { out[0] = '
                 + " + ".join(f"pad{i}(x[0])" for i in range(functions)) + "; }")
    return "\n".join(parts) + "\n"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NodeProcess:
    """A sandbox node in its own process group (`python -m sandbox.service`, CPU backend, one worker), so a
    test can SIGKILL it with its workers and start it again on the same port."""

    def __init__(self, tmp, port: int | None = None, name: str = "node"):
        from pathlib import Path

        self.tmp = Path(tmp)
        self.port = port or free_port()
        self.name = name
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> "NodeProcess":
        import os
        import subprocess
        import sys
        from pathlib import Path

        repo = Path(__file__).resolve().parents[2]
        ready = self.tmp / f"{self.name}-{self.port}.ready"
        ready.unlink(missing_ok=True)
        self.ready_file = ready
        args = [sys.executable, "-m", "sandbox.service", f"endpoint={self.endpoint}", f"node_id={self.name}",
                "workers=1", "build_workers=1", "metrics_port=-1", f"ready_file={ready}", "sandbox.backend=cpu",
                "sandbox.use_compile=false", "sandbox.reps=5", "sandbox.num_trials=2",
                f"sandbox.cache_dir={self.tmp / (self.name + '-cache')}", f"sandbox.work_root={self.tmp / 'work'}"]
        env = dict(os.environ, PYTHONPATH=str(repo))
        self.log = open(self.tmp / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(args, cwd=repo, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        import time

        deadline = time.monotonic() + timeout_s
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited with {self.proc.returncode}; see {self.log.name}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {self.name} not ready in {timeout_s} s")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the node and its worker processes (its own process group)."""
        import os
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()

    def stop(self) -> None:
        import os
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except Exception:  # noqa: BLE001
                self.kill()
        if not self.log.closed:
            self.log.close()


class GatedPolicy(ScriptedPolicy):
    """A scripted policy whose every call waits for a permit (`release(n)`), so a test decides when each
    episode's turn happens."""

    def __init__(self, tokenizer, scripts, version: int = 1, permits=None):
        import threading

        super().__init__(tokenizer, scripts, version)
        self.permits = permits if permits is not None else threading.Semaphore(0)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.permits.release()

    def generate(self, prompts, settings):
        for _ in prompts:
            if not self.permits.acquire(timeout=120):
                raise TimeoutError("gated policy: no permit within 120 s")
        return super().generate(prompts, settings)
