"""The chat format (ChatML, as Qwen2.5 / Qwen3 use it), the tool-call syntax, and multi-turn token bookkeeping.

Rendering, message by message (each piece tokenized on its own and concatenated, so boundaries are fixed):

    <|im_start|>system\\n{content}<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}<|im_end|>\\n           loss mask 1 on {content} and <|im_end|> only
    <|im_start|>user\\n<tool_response>\\n{tool 1}\\n</tool_response>\\n<tool_response>\\n{tool 2}\\n</tool_response><|im_end|>\\n

Consecutive `tool` messages share one user turn, as in Qwen's template. An assistant message's `content` is
the whole text the model writes, tool calls included; `parse(render(messages)) == messages`.

Tool calls (defined here, once): inside assistant text, each call is

    <tool_call>
    {"name": "<tool name>", "arguments": {<JSON object>}}
    </tool_call>

`format_tool_call` writes one; `parse_tool_calls` reads them strictly (ToolCallError with a message the agent
loop can hand back to the model). Text outside the blocks is free.

Multi-turn bookkeeping (`ChatTokens`): sampled ids are appended exactly as generated, with their behaviour
log-probs and loss mask 1; observations are appended as freshly tokenized segments with mask 0. Sampled text
is never decoded and re-encoded into the token record (that misaligns tokens and log-probs).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Sequence

import numpy as np

from learner.tokenizer import (IM_END, IM_START, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_RESPONSE_CLOSE,
                               TOOL_RESPONSE_OPEN, Tokenizer)

ROLES = ("system", "user", "assistant", "tool")


class ChatFormatError(ValueError):
    """A message cannot be rendered, or token ids do not parse as a rendered conversation."""


class ToolCallError(ValueError):
    """Assistant text holds a malformed tool call; the message says what and where (for the model to read)."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclasses.dataclass(frozen=True)
class Message:
    """One chat message. role: "system" | "user" | "assistant" | "tool"; content: its text (for assistant
    messages the full model output, tool-call blocks included)."""

    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ChatFormatError(f"unknown role {self.role!r}; roles are {ROLES}")
        if not isinstance(self.content, str):
            raise ChatFormatError(f"{self.role} message content must be str, got {type(self.content).__name__}")

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls in an assistant message (strict parse; raises ToolCallError)."""
        return parse_tool_calls(self.content) if self.role == "assistant" else []


@dataclasses.dataclass
class RenderedChat:
    """ids `[N]` int32 and loss_mask `[N]` int32 (1 on assistant content and its closing <|im_end|>)."""

    ids: np.ndarray
    loss_mask: np.ndarray


# -------------------------------------------------------------------------------------- tool calls


def format_tool_call(name: str, arguments: dict) -> str:
    """One tool-call block, as Qwen models write them."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def assistant_text(content: str, calls: Sequence[ToolCall] = ()) -> str:
    """Assistant text with tool-call blocks after the prose (one newline between pieces), as Qwen's template."""
    text = content
    for call in calls:
        text = (text + "\n" if text else "") + format_tool_call(call.name, call.arguments)
    return text


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ToolCallError(f"duplicate key(s) {dupes} in a tool call")
    return dict(pairs)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """All tool calls in assistant text, in order.

    Strict: tags must pair up without nesting; each block holds exactly one JSON object (surrounding
    whitespace allowed) with exactly the keys "name" (non-empty string) and "arguments" (object).
    Raises ToolCallError naming the call's number and the problem.
    """
    calls: list[ToolCall] = []
    pos = 0
    while True:
        open_at = text.find(TOOL_CALL_OPEN, pos)
        close_at = text.find(TOOL_CALL_CLOSE, pos)
        if open_at < 0:
            if close_at >= 0:
                raise ToolCallError(f"{TOOL_CALL_CLOSE} without a matching {TOOL_CALL_OPEN}")
            return calls
        if 0 <= close_at < open_at:
            raise ToolCallError(f"{TOOL_CALL_CLOSE} without a matching {TOOL_CALL_OPEN}")
        n = len(calls) + 1
        start = open_at + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, start)
        if end < 0:
            raise ToolCallError(f"tool call {n}: {TOOL_CALL_OPEN} is never closed with {TOOL_CALL_CLOSE}")
        body = text[start:end]
        if TOOL_CALL_OPEN in body:
            raise ToolCallError(f"tool call {n}: nested {TOOL_CALL_OPEN}")
        try:
            obj = json.loads(body, object_pairs_hook=_reject_duplicates)
        except ToolCallError as e:
            raise ToolCallError(f"tool call {n}: {e}") from None
        except ValueError as e:
            raise ToolCallError(f"tool call {n}: not valid JSON ({e.args[0] if e.args else e})") from None
        if not isinstance(obj, dict):
            raise ToolCallError(f"tool call {n}: expected a JSON object, got {type(obj).__name__}")
        if set(obj) != {"name", "arguments"}:
            raise ToolCallError(f"tool call {n}: expected exactly the keys 'name' and 'arguments', got {sorted(obj)}")
        if not isinstance(obj["name"], str) or not obj["name"]:
            raise ToolCallError(f"tool call {n}: 'name' must be a non-empty string")
        if not isinstance(obj["arguments"], dict):
            raise ToolCallError(f"tool call {n}: 'arguments' must be a JSON object, got "
                                f"{type(obj['arguments']).__name__}")
        calls.append(ToolCall(obj["name"], obj["arguments"]))
        pos = end + len(TOOL_CALL_CLOSE)


def tools_system_prompt(tools: Sequence[dict], preamble: str = "") -> str:
    """A system prompt that lists tools (JSON schemas, one per line inside <tools></tools>) and the call syntax."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    example = format_tool_call("<tool name>", {"<argument>": "<value>"})
    return ((preamble.rstrip() + "\n\n" if preamble else "")
            + "# Tools\n\nYou can call these tools, described by JSON schemas:\n<tools>\n" + listing
            + "\n</tools>\n\nTo call a tool, write a JSON object with its name and arguments between "
            + f"{TOOL_CALL_OPEN} and {TOOL_CALL_CLOSE} tags, like this:\n{example}")


# ----------------------------------------------------------------------------------------- render


def neutralise_special_tokens(text: str) -> str:
    """`text` with the chat's special tokens spelled with spaces ("<| im_end |>"), for tool and user messages that
    quote what a policy wrote (a compiler log quoting a source line, a file read back): such text can then never
    close or open a turn, and `ChatFormat.render` accepts it."""
    return text.replace(IM_START, "<| im_start |>").replace(IM_END, "<| im_end |>")


class ChatFormat:
    """Renders messages to token ids + loss mask and parses ids back, for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._newline = tokenizer.encode("\n")

    def _header(self, role: str) -> list[int]:
        return [self.tokenizer.im_start_id] + self.tokenizer.encode(role + "\n")

    def _check(self, m: Message) -> None:
        for token in (IM_START, IM_END):
            if token in m.content:
                raise ChatFormatError(f"{m.role} message content contains the special token {token}")

    def generation_prompt(self) -> list[int]:
        """<|im_start|>assistant\\n: what precedes the model's turn."""
        return self._header("assistant")

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> RenderedChat:
        """Token ids and loss mask of a conversation (see the module docstring for the layout)."""
        ids: list[int] = []
        mask: list[int] = []

        def put(tokens: list[int], m: int) -> None:
            ids.extend(tokens)
            mask.extend([m] * len(tokens))

        msgs = list(messages)
        i = 0
        while i < len(msgs):
            m = msgs[i]
            self._check(m)
            if m.role == "tool":
                parts = []
                while i < len(msgs) and msgs[i].role == "tool":
                    self._check(msgs[i])
                    parts.append(f"{TOOL_RESPONSE_OPEN}\n{msgs[i].content}\n{TOOL_RESPONSE_CLOSE}")
                    i += 1
                put(self._header("user") + self.tokenizer.encode("\n".join(parts)), 0)
                put([self.tokenizer.im_end_id] + self._newline, 0)
                continue
            put(self._header(m.role), 0)
            if m.role == "assistant":
                put(self.tokenizer.encode(m.content) + [self.tokenizer.im_end_id], 1)
                put(self._newline, 0)
            else:
                put(self.tokenizer.encode(m.content) + [self.tokenizer.im_end_id] + self._newline, 0)
            i += 1
        if add_generation_prompt:
            put(self.generation_prompt(), 0)
        return RenderedChat(np.asarray(ids, np.int32), np.asarray(mask, np.int32))

    def render_observation(self, messages: Sequence[Message]) -> list[int]:
        """Fresh tokens for tool/user messages after an assistant turn, ending with the generation prompt."""
        return self.render(messages, add_generation_prompt=True).ids.tolist()

    def parse(self, ids: Sequence[int]) -> list[Message]:
        """The inverse of `render` (without a trailing generation prompt, which parses as nothing).

        Raises ChatFormatError when the ids are not a sequence of <|im_start|>role\\n...<|im_end|>\\n turns.
        """
        ids = list(map(int, ids))
        tok = self.tokenizer
        out: list[Message] = []
        pos = 0
        while pos < len(ids):
            if ids[pos] != tok.im_start_id:
                raise ChatFormatError(f"token {pos}: expected {IM_START}, got id {ids[pos]}")
            try:
                end = ids.index(tok.im_end_id, pos + 1)
            except ValueError:
                rest = tok.decode(ids[pos + 1:])
                if rest == "assistant\n":
                    return out  # a trailing generation prompt
                raise ChatFormatError(f"token {pos}: turn is never closed with {IM_END}") from None
            text = tok.decode(ids[pos + 1:end])
            role, sep, content = text.partition("\n")
            if not sep or role not in ("system", "user", "assistant"):
                raise ChatFormatError(f"token {pos}: bad turn header {role!r}")
            out.extend(self._split_tool_responses(content) if role == "user" else [Message(role, content)])
            pos = end + 1
            if ids[pos:pos + len(self._newline)] != self._newline:
                raise ChatFormatError(f"token {pos}: expected a newline after {IM_END}")
            pos += len(self._newline)
        return out

    @staticmethod
    def _split_tool_responses(content: str) -> list[Message]:
        if not content.startswith(TOOL_RESPONSE_OPEN + "\n"):
            return [Message("user", content)]
        messages = []
        rest = content
        sep = "\n" + TOOL_RESPONSE_CLOSE
        while rest:
            if not rest.startswith(TOOL_RESPONSE_OPEN + "\n") or sep not in rest:
                return [Message("user", content)]
            body, _, rest = rest[len(TOOL_RESPONSE_OPEN) + 1:].partition(sep)
            messages.append(Message("tool", body))
            if rest.startswith("\n" + TOOL_RESPONSE_OPEN):
                rest = rest[1:]
            elif rest:
                return [Message("user", content)]
        return messages


# ---------------------------------------------------------------------------- multi-turn bookkeeping


class ChatTokens:
    """The token record of one multi-turn episode: ids, loss mask and behaviour log-probs, aligned.

    Start from the prompt messages (rendered with the generation prompt), then alternate `add_sampled` (the
    sampler's ids and log-probs, kept verbatim) and `add_observation` (tool results, freshly tokenized).
    """

    def __init__(self, chat: ChatFormat, messages: Sequence[Message]):
        self.chat = chat
        rendered = chat.render(messages, add_generation_prompt=True)
        self.ids: list[int] = rendered.ids.tolist()
        self.loss_mask: list[int] = rendered.loss_mask.tolist()
        self.logprobs: list[float] = [0.0] * len(self.ids)
        self.num_turns = 0

    def context(self) -> list[int]:
        """The ids to prefill for the next sample."""
        return list(self.ids)

    def add_sampled(self, tokens: Sequence[int], logprobs: Sequence[float]) -> str:
        """Append one assistant turn as sampled; returns its text (for tool-call parsing).

        tokens / logprobs: the sampler's output, same length. If the turn did not end with a stop token
        (length limit, stop string), <|im_end|> is appended with mask 0 and log-prob 0 (it was not sampled).
        """
        tokens = [int(t) for t in tokens]
        if len(tokens) != len(logprobs):
            raise ValueError(f"{len(tokens)} tokens but {len(logprobs)} log-probs")
        tok = self.chat.tokenizer
        self.ids.extend(tokens)
        self.loss_mask.extend([1] * len(tokens))
        self.logprobs.extend(float(x) for x in logprobs)
        body = tokens
        if tokens and tokens[-1] in tok.stop_token_ids:
            body = tokens[:-1]
            if tokens[-1] != tok.im_end_id:  # e.g. <|endoftext|>: close the turn for the next observation
                self._put([tok.im_end_id], 0)
        else:
            self._put([tok.im_end_id], 0)
        self._put(self.chat._newline, 0)
        self.num_turns += 1
        return tok.decode(body)

    def add_observation(self, messages: Sequence[Message]) -> None:
        """Append tool results / user messages (mask 0) followed by the next generation prompt."""
        self._put(self.chat.render_observation(messages), 0)

    def _put(self, ids: Iterable[int], mask: int) -> None:
        ids = list(ids)
        self.ids.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids `[N]` int32, loss_mask `[N]` int32, behaviour logprobs `[N]` float32; 0 where not sampled)."""
        return (np.asarray(self.ids, np.int32), np.asarray(self.loss_mask, np.int32),
                np.asarray(self.logprobs, np.float32))
