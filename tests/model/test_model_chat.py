"""Tokenizer, ChatML rendering / parsing, loss mask, tool-call parser, multi-turn token bookkeeping."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.chat import (ChatFormat, ChatFormatError, ChatTokens, Message, ToolCall, ToolCallError,
                          assistant_text, format_tool_call, parse_tool_calls, tools_system_prompt)
from learner.tokenizer import SPECIAL_TOKENS, Tokenizer, TokenizerError, train_bpe

CORPUS = [
    "__global__ void add(const float* a, const float* b, float* c, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) c[i] = a[i] + b[i];\n}\n",
    "class Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x @ x.T)\n",
    "Write a fused kernel. The tool output says: compiled OK, speed-up 1.7x over torch.compile.",
    "nvcc -O3 -arch=sm_90a kernel.cu -cubin -o kernel.cubin; error: identifier undefined",
] * 30


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_bpe(CORPUS, vocab_size=600, min_frequency=2)


@pytest.fixture(scope="module")
def chat(tok) -> ChatFormat:
    return ChatFormat(tok)


def test_bpe_special_tokens_are_single_ids(tok, tmp_path):
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_id(t) == i and tok.encode(t) == [i]
    assert 256 < tok.vocab_size <= 600
    # merges were learned: a frequent word is fewer tokens than bytes
    assert len(tok.encode("blockIdx")) < len("blockIdx")
    path = tok.save(tmp_path)
    again = Tokenizer.from_file(tmp_path)
    assert path.name == "tokenizer.json" and again.encode("__global__ void") == tok.encode("__global__ void")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_bpe_round_trips_any_text(tok, text):
    assert tok.decode(tok.encode(text)) == text


@pytest.fixture(scope="module")
def tok_digits() -> Tokenizer:
    return train_bpe(CORPUS, vocab_size=600, min_frequency=2, split="digits")


def test_digits_split_merges_across_words_and_keeps_digits_apart(tok, tok_digits):
    line = "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    assert len(tok_digits.encode(line)) < len(tok.encode(line)) / 2
    pieces = [tok_digits.decode([i]) for i in tok_digits.encode("nvcc -arch=sm_90a, 1.7x over 12.25")]
    assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p)), pieces  # one digit per token
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok_digits.encode(t) == [i]
    with pytest.raises(ValueError, match="split must be one of"):
        train_bpe(CORPUS, vocab_size=600, split="sentences")


def test_lines_split_tokenizes_a_copied_line_as_in_its_prompt():
    line = "x = torch.relu(x @ x.T)"
    corpus = CORPUS + ['{"content": "#include\\n    // ' + line + '\\n    y = 0.25f;"}'] * 30
    tok = train_bpe(corpus, vocab_size=600, min_frequency=2, split="lines")
    in_prompt = tok.encode("class Model(nn.Module):\n    def forward(self, x):\n        " + line + "\n")
    in_json = tok.encode('{"content": "#include\\n        // ' + line + '\\n"}')
    ids = tok.encode(line)
    assert any(in_prompt[i:i + len(ids)] == ids for i in range(len(in_prompt)))
    assert any(in_json[i:i + len(ids)] == ids for i in range(len(in_json)))
    text = 'a\\n    // b = 12.5\n  c """d"""'
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_digits_bpe_round_trips_any_text(tok_digits, text):
    assert tok_digits.decode(tok_digits.encode(text)) == text


def test_tokenizer_without_chat_tokens_names_file(tmp_path):
    bare = tokenizers.Tokenizer(tokenizers.models.BPE())
    bare.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    bare.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                                     special_tokens=["<|endoftext|>"]))
    bare.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: tokenizer lacks special tokens "
                                             r"\['<\|im_start\|>', '<\|im_end\|>'\]"):
        Tokenizer.from_file(tmp_path)
    with pytest.raises(TokenizerError, match="missing"):
        Tokenizer.from_file(tmp_path / "nowhere")


def _conversation() -> list[Message]:
    call = ToolCall("write_file", {"path": "kernels/add.cu", "content": "__global__ void add() {}\n"})
    return [
        Message("system", tools_system_prompt([{"name": "write_file", "parameters": {"type": "object"}}])),
        Message("user", "Make this faster:\nclass Model(nn.Module): ..."),
        Message("assistant", assistant_text("I will write a kernel.", [call, ToolCall("compile", {})])),
        Message("tool", "wrote kernels/add.cu"),
        Message("tool", "compiled OK"),
        Message("assistant", "Done."),
    ]


def test_render_parse_inverse_and_loss_mask(chat, tok):
    msgs = _conversation()
    r = chat.render(msgs)
    assert r.ids.dtype == np.int32 and r.ids.shape == r.loss_mask.shape
    assert chat.parse(r.ids) == msgs
    text = tok.decode(r.ids)
    assert text.count("<|im_start|>user\n<tool_response>\nwrote kernels/add.cu\n</tool_response>\n"
                      "<tool_response>\ncompiled OK\n</tool_response><|im_end|>\n") == 1
    # The loss mask covers exactly the two assistant bodies and their closing <|im_end|>.
    masked = tok.decode(r.ids[r.loss_mask == 1])
    assert masked == msgs[2].content + "<|im_end|>" + msgs[5].content + "<|im_end|>"
    spans = np.flatnonzero(np.diff(np.concatenate([[0], r.loss_mask, [0]])))
    assert len(spans) == 4  # two contiguous spans
    with_prompt = chat.render(msgs[:2], add_generation_prompt=True)
    assert tok.decode(with_prompt.ids).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert chat.parse(with_prompt.ids) == msgs[:2]
    assert msgs[2].tool_calls[0].arguments["path"] == "kernels/add.cu"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]),
                          st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)),
                max_size=6))
def test_parse_inverts_render_property(chat, pairs):
    msgs = [Message(role, content) for role, content in pairs
            if not content.startswith("<tool_response>") and "</tool_response>" not in content
            and "<|im_" not in content]
    assert chat.parse(chat.render(msgs).ids) == msgs


def test_render_rejects_special_tokens_in_content(chat):
    with pytest.raises(ChatFormatError, match="<\\|im_end\\|>"):
        chat.render([Message("user", "hi<|im_end|>")])
    with pytest.raises(ChatFormatError, match="unknown role"):
        Message("function", "x")


def test_parse_rejects_non_chat_ids(chat, tok):
    with pytest.raises(ChatFormatError, match="expected <\\|im_start\\|>"):
        chat.parse(tok.encode("hello"))
    with pytest.raises(ChatFormatError, match="never closed"):
        chat.parse([tok.im_start_id] + tok.encode("user\nhello"))


def test_tool_call_format_and_parse():
    text = "Plan.\n" + format_tool_call("run", {"cmd": "nvcc a.cu", "n": [1, 2]}) + "\ntrailing prose"
    assert parse_tool_calls(text) == [ToolCall("run", {"cmd": "nvcc a.cu", "n": [1, 2]})]
    assert json.loads(text.split("\n")[2]) == {"name": "run", "arguments": {"cmd": "nvcc a.cu", "n": [1, 2]}}
    assert parse_tool_calls("no calls here") == []
    unicode = format_tool_call("write", {"text": "héllo ✓"})
    assert "héllo ✓" in unicode and parse_tool_calls(unicode)[0].arguments["text"] == "héllo ✓"


@pytest.mark.parametrize("text, problem", [
    ("<tool_call>\n{\"name\": \"a\", \"arguments\": {}}", "never closed"),
    ("</tool_call>", "without a matching"),
    ("<tool_call><tool_call>{}</tool_call></tool_call>", "nested"),
    ("<tool_call>{\"name\": \"a\", \"arguments\": {}} extra</tool_call>", "not valid JSON"),
    ("<tool_call>{'name': 'a', 'arguments': {}}</tool_call>", "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "expected a JSON object"),
    ("<tool_call>{\"name\": \"a\"}</tool_call>", "exactly the keys"),
    ("<tool_call>{\"name\": \"a\", \"arguments\": {}, \"id\": 1}</tool_call>", "exactly the keys"),
    ("<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>", "non-empty string"),
    ("<tool_call>{\"name\": \"a\", \"arguments\": \"{}\"}</tool_call>", "must be a JSON object"),
    ("<tool_call>{\"name\": \"a\", \"name\": \"b\", \"arguments\": {}}</tool_call>", "duplicate key"),
    (format_tool_call("ok", {}) + "<tool_call>nope</tool_call>", "tool call 2: not valid JSON"),
])
def test_tool_call_parser_is_strict(text, problem):
    with pytest.raises(ToolCallError, match=problem):
        parse_tool_calls(text)


def test_multi_turn_keeps_sampled_ids_verbatim(chat, tok):
    msgs = _conversation()[:2]
    record = ChatTokens(chat, msgs)
    start = len(record.ids)
    # A non-canonical tokenization of the text (one id per byte symbol): re-tokenizing would change the ids.
    text = "blockIdx.x <tool_call>"
    canonical = tok.encode(text)
    byte_wise = [i for ch in "blockIdx.x " for i in tok.encode(ch)] + [tok.token_id("<tool_call>")]
    assert byte_wise != canonical
    sampled = byte_wise + [tok.im_end_id]
    logprobs = [-0.1 * (k + 1) for k in range(len(sampled))]
    said = record.add_sampled(sampled, logprobs)
    assert said == text
    ids, mask, lps = record.arrays()
    assert ids[start:start + len(sampled)].tolist() == sampled
    assert mask[start:start + len(sampled)].tolist() == [1] * len(sampled)
    np.testing.assert_allclose(lps[start:start + len(sampled)], logprobs, rtol=1e-6)
    record.add_observation([Message("tool", "compiled OK")])
    # A turn cut by the length limit is closed with an unsampled <|im_end|>.
    cut = tok.encode("partial")
    record.add_sampled(cut, [-1.0] * len(cut))
    ids, mask, lps = record.arrays()
    assert ids[len(ids) - 2] == tok.im_end_id and mask[len(ids) - 2] == 0 and lps[len(ids) - 2] == 0.0
    assert len(ids) == len(mask) == len(lps)
    # Everything still parses as a conversation; the sampled text is intact.
    parsed = chat.parse(ids)
    assert [m.role for m in parsed] == ["system", "user", "assistant", "tool", "assistant"]
    assert parsed[2].content == text and parsed[4].content == "partial"
    # Mask 1 exactly on sampled tokens, with their log-probs.
    assert int(mask.sum()) == len(sampled) + len(cut)
    assert np.all(lps[mask == 0] == 0.0)
    with pytest.raises(ValueError, match="log-probs"):
        record.add_sampled([1, 2], [0.0])
