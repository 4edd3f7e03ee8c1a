"""An optional composer that asks a language model, through an OpenAI-compatible endpoint, to write the task.

Same call as `tasks.compose.GraphComposer`: `compose(index, category, depth) -> Task`. The operator list is
drawn from the registry exactly as the graph composer would (anchor of the category plus fillers), and the
model is asked to fuse them into a KernelBench-format reference with module-level int size constants. The
answer's first ```python block is checked statically (`tasks.validate.check_static`); everything else
(running it, determinism, timing) is left to the same filters as any other candidate.

Endpoint: POST `{base_url}/chat/completions` with `{"model", "messages", "temperature", "max_tokens"}`
and `Authorization: Bearer <api_key>` when a key is given (stdlib urllib; no extra dependency).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from tasks.compose import ComposeConfig, ComposeError, GraphComposer
from tasks.schema import Task
from tasks.validate import TaskValidationError, check_static

_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)

PROMPT = """Write a PyTorch reference program in KernelBench format that applies these operators, in this
order, to its input: {ops}.

Rules:
- Define `class Model(nn.Module)` with `__init__` and `forward`, `get_inputs()` returning a list of input
  tensors (use torch.randn / torch.rand / torch.randint) and `get_init_inputs()` returning the constructor
  arguments.
- Declare every size as a module-level int constant (e.g. `batch_size = 16`) and read those constants in
  get_inputs and get_init_inputs; sizes must keep one forward below about 10 ms on one CPU core.
- Deterministic, float32, no randomness inside forward, no dropout, no printing, no file or network access.
- Reply with one ```python code block and nothing else."""


@dataclass
class LLMComposerConfig:
    """Endpoint settings.

    Fields:
      base_url: e.g. "http://localhost:8000/v1" (the `/chat/completions` path is appended).
      model: model name sent in the request.
      api_key: bearer token, or "" for none.
      temperature: sampling temperature.
      max_tokens: completion limit.
      timeout_s: HTTP timeout per request, seconds.
    """

    base_url: str
    model: str
    api_key: str = ""
    temperature: float = 0.7
    max_tokens: int = 2048
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


def extract_code(text: str) -> str | None:
    """The first fenced python block of a reply (or the whole reply when it already looks like a module)."""
    m = _CODE.search(text)
    if m:
        return m.group(1)
    if "class Model" in text and "def get_inputs" in text:
        return text
    return None


class LLMComposer:
    """Composer backed by an OpenAI-compatible chat endpoint. Raises ComposeError on any failure."""

    def __init__(self, config: LLMComposerConfig, compose_config: ComposeConfig | None = None):
        self.config = config
        self.compose_config = compose_config or ComposeConfig()
        self._graph = GraphComposer(self.compose_config)
        self.categories = self._graph.categories

    def _operators(self, index: int, category: str | None, depth: int | None) -> tuple[str, list[str], int]:
        """The operator list for a request, drawn as the graph composer draws it."""
        task = self._graph.compose(index, category, depth)
        return task.category, list(task.operators), task.provenance["attempt"]

    def _chat(self, prompt: str) -> str:
        cfg = self.config
        body = json.dumps({
            "model": cfg.model,
            "messages": [{"role": "system", "content": "You write small, correct PyTorch programs."},
                         {"role": "user", "content": prompt}],
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
        }).encode()
        headers = {"Content-Type": "application/json"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        req = urllib.request.Request(cfg.base_url.rstrip("/") + "/chat/completions", data=body, headers=headers,
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:
                payload = json.loads(resp.read().decode())
        except urllib.error.HTTPError as e:
            raise ComposeError(f"{cfg.base_url}: HTTP {e.code}: {e.read()[:200]!r}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise ComposeError(f"{cfg.base_url}: request failed: {e}") from None
        except json.JSONDecodeError as e:
            raise ComposeError(f"{cfg.base_url}: reply is not JSON: {e}") from None
        try:
            return payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ComposeError(f"{cfg.base_url}: reply has no choices[0].message.content") from None

    def compose(self, index: int, category: str | None = None, depth: int | None = None) -> Task:
        category, ops, _ = self._operators(index, category, depth)
        reply = self._chat(PROMPT.format(ops=", ".join(ops)))
        code = extract_code(reply)
        task_id = f"llm_s{self.compose_config.seed}_{index:06d}"
        if code is None:
            raise ComposeError(f"{task_id}: the reply has no python code block")
        try:
            info = check_static(code, f"<{task_id}>")
        except TaskValidationError as e:
            raise ComposeError(str(e)) from None
        return Task(
            id=task_id, name="_".join(ops), reference=code, source="synthesized", level=2, category=category,
            operators=tuple(ops), shape_params=dict(info.shape_params),
            metadata={"depth": len(ops), "size": "cpu"},
            provenance={"composer": "llm", "model": self.config.model, "base_url": self.config.base_url,
                        "seed": self.compose_config.seed, "index": index},
        )


__all__ = ["LLMComposer", "LLMComposerConfig", "extract_code", "PROMPT"]
