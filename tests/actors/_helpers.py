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
    corpus = [system_prompt(f, m, 8) for f in ("cpu", "cubin", "extension") for m in ("multi_turn", "single_turn")]
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
