"""An external OpenAI-compatible chat-completions endpoint as a policy (evaluation mode: compare frontier or
locally served models in the same harness, same tools, same sandbox).

The episode's token context is parsed back into messages (`learner.chat.ChatFormat.parse`), sent as
`POST {base_url}/chat/completions`, and the reply text is tokenized with our tokenizer (for context
accounting) and closed with <|im_end|>. Tool results travel as user messages holding
`<tool_response>` blocks, as in the ChatML rendering; a reply's structured `tool_calls` (function calling) are
turned into our `<tool_call>` text syntax. Behaviour log-probs are 0: these episodes are not trained on.

HTTP: the standard library (urllib), requests in parallel on `max_concurrency` threads, retries with
back-off on 429 / 5xx / connection errors, a per-request timeout. Failure after the retries raises
`PolicyEndpointError` (the episode ends with status policy_error).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

import numpy as np

from actors.sampler import FINISH_LENGTH, FINISH_STOP_TOKEN, Completion, SamplingParams
from learner.chat import ChatFormat, format_tool_call
from learner.tokenizer import TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN


class PolicyEndpointError(RuntimeError):
    """The endpoint did not give a usable reply (after retries); the message names the status and body."""


def to_openai_messages(chat: ChatFormat, prompt: Sequence[int]) -> list[dict[str, str]]:
    """Token context -> chat-completions messages (tool results folded into user messages)."""
    out: list[dict[str, str]] = []
    for m in chat.parse(prompt):
        if m.role == "tool":
            block = f"{TOOL_RESPONSE_OPEN}\n{m.content}\n{TOOL_RESPONSE_CLOSE}"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": "1"})
        else:
            out.append({"role": m.role, "content": m.content})
    return [{k: v for k, v in m.items() if k != "_tool"} for m in out]


def reply_text(message: dict[str, Any]) -> str:
    """The assistant text of a reply, with structured tool calls written in our tool-call syntax."""
    text = message.get("content") or ""
    if isinstance(text, list):  # content parts
        text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {"_unparsed": fn.get("arguments")}
        text = (text + "\n" if text else "") + format_tool_call(str(fn.get("name", "")), args if isinstance(args, dict)
                                                                else {"_value": args})
    return text


class OpenAIPolicy:
    """See the module doc.

    Args:
      base_url: e.g. "http://localhost:8000/v1" (the part before /chat/completions).
      model: the model name the endpoint serves.
      chat: our chat format (its tokenizer counts context tokens).
      api_key: sent as a Bearer token when given (pass it in; this class reads no environment or files).
      timeout_s: per request; retries: tries after the first on 429 / 5xx / connection errors.
      max_concurrency: requests in flight at once.
      extra_body: extra JSON fields for every request (e.g. {"seed": 0}).
    """

    version = -1

    def __init__(self, base_url: str, model: str, chat: ChatFormat, *, api_key: str | None = None,
                 timeout_s: float = 600.0, retries: int = 3, max_concurrency: int = 16,
                 extra_body: dict[str, Any] | None = None, backoff_s: float = 1.0):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.name = f"openai:{model}"
        self.chat = chat
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.extra_body = dict(extra_body or {})
        self.max_concurrency = max_concurrency
        self.stats = {"requests": 0, "retries": 0, "failures": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def generate(self, prompts: Sequence[Sequence[int]],
                 settings: Sequence[SamplingParams]) -> list[Completion | PolicyEndpointError]:
        """One request per prompt, in parallel; a prompt whose request fails gets its PolicyEndpointError in
        its place (the other episodes of the batch go on)."""
        def one(prompt: Sequence[int], sp: SamplingParams) -> Completion | PolicyEndpointError:
            try:
                return self._one(prompt, sp)
            except PolicyEndpointError as e:
                return e

        with concurrent.futures.ThreadPoolExecutor(max(1, min(self.max_concurrency, len(prompts)))) as pool:
            return list(pool.map(one, prompts, settings))

    def _one(self, prompt: Sequence[int], sp: SamplingParams) -> Completion:
        body = {"model": self.model, "messages": to_openai_messages(self.chat, prompt), "max_tokens": sp.max_new_tokens,
                "temperature": sp.temperature, "n": 1, **self.extra_body}
        if sp.top_p < 1.0:
            body["top_p"] = sp.top_p
        reply = self._post(body)
        try:
            choice = reply["choices"][0]
            text = reply_text(choice["message"])
        except (KeyError, IndexError, TypeError) as e:
            raise PolicyEndpointError(f"{self.url}: reply without choices[0].message ({e}): "
                                      f"{json.dumps(reply)[:300]}") from None
        usage = reply.get("usage") or {}
        self.stats["prompt_tokens"] += int(usage.get("prompt_tokens", 0) or 0)
        self.stats["completion_tokens"] += int(usage.get("completion_tokens", 0) or 0)
        tok = self.chat.tokenizer
        ids = tok.encode(text)
        reason = FINISH_LENGTH if choice.get("finish_reason") == "length" else FINISH_STOP_TOKEN
        if len(ids) >= sp.max_new_tokens:
            ids, reason = ids[:sp.max_new_tokens], FINISH_LENGTH
        if reason == FINISH_STOP_TOKEN:
            ids = ids + [tok.im_end_id]
        return Completion(ids, np.zeros(len(ids), np.float32), reason)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            self.stats["requests"] += 1
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read().decode())
            except urllib.error.HTTPError as e:
                detail = e.read()[:500].decode(errors="replace")
                last = f"HTTP {e.code}: {detail}"
                if e.code != 429 and e.code < 500:
                    break  # a request the endpoint will never accept
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = f"{type(e).__name__}: {e}"
            except ValueError as e:
                last = f"reply is not JSON: {e}"
        self.stats["failures"] += 1
        raise PolicyEndpointError(f"{self.url}: {last}")
