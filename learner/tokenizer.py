"""Tokenizers: a checkpoint's `tokenizer.json` (Hugging Face `tokenizers`), and byte-level BPE training for
models trained from scratch, with the special tokens the ChatML chat format (`learner/chat.py`) needs.

Encoding never adds BOS/EOS or other template tokens by itself: `learner.chat` places every special token
explicitly. Decoding keeps special tokens, so `decode(encode(text)) == text` for byte-level BPE tokenizers
without a normalizer (Qwen's tokenizer.json applies NFC first: equal up to NFC).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"

REQUIRED_SPECIAL_TOKENS = (IM_START, IM_END)
"""Tokens the chat format cannot do without: each must be a single id in the vocabulary."""
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END, TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN,
                  TOOL_RESPONSE_CLOSE)
"""Special tokens of a from-scratch tokenizer (ids 0..6, in this order), the same strings as Qwen2.5/Qwen3."""


class TokenizerError(ValueError):
    """A tokenizer file is missing, unreadable or lacks the special tokens the chat format needs."""


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the ids of the chat format's special tokens.

    Raises TokenizerError (naming `source`) when a required special token is not a single id.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, source: str = "<in memory>"):
        self.tokenizer = tokenizer
        self.source = source
        missing = [t for t in REQUIRED_SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            raise TokenizerError(f"{source}: tokenizer lacks special tokens {missing} needed by the ChatML chat "
                                 f"format (add them, or train one with learner.tokenizer.train_bpe)")
        self.im_start_id: int = tokenizer.token_to_id(IM_START)
        self.im_end_id: int = tokenizer.token_to_id(IM_END)
        self.end_of_text_id: int | None = tokenizer.token_to_id(END_OF_TEXT)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Tokenizer":
        """Load `tokenizer.json` (a file, or a checkpoint folder holding one)."""
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise TokenizerError(f"{file}: missing (a checkpoint folder needs tokenizer.json)")
        try:
            tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception for malformed files
            raise TokenizerError(f"{file}: not a tokenizers tokenizer.json ({e})") from None
        return cls(tok, str(file))

    def save(self, path: str | os.PathLike) -> Path:
        """Write tokenizer.json (into `path` if it is a folder)."""
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        self.tokenizer.save(str(file))
        return file

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the model's vocab_size must be at least this)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn: <|im_end|> and, if present, <|endoftext|>."""
        return (self.im_end_id,) + ((self.end_of_text_id,) if self.end_of_text_id is not None else ())

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added (special-token strings inside map to their ids)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens kept. A partial UTF-8 sequence decodes to U+FFFD."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


SPLITS = ("words", "digits", "lines")
"""Pre-tokenization of `train_bpe`: "words" = GPT-2's regex (merges stay inside a word, a number or a run of
punctuation); "digits" = only digits are split off, one each, so merges may span spaces and punctuation (code
lines such as `float x = in_x[i];` become a few tokens: 3-4x fewer tokens on a small code corpus) while numbers
stay digit by digit, as they are copied from a prompt into a solution; "lines" = "digits", and also a newline (real
or JSON-escaped `\\n`) with the indentation after it, comment markers (`// `, `# `), triple quotes and `Plan: `
are pieces of their own, so a line copied from a prompt into a comment or a JSON string tokenizes as it did
there."""
LINE_PIECES = r'\\n *|\n *|// |# |\"\"\"|Plan: '
"""The pieces "lines" isolates (an Oniguruma regex)."""


def train_bpe(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2,
              special_tokens: Sequence[str] = SPECIAL_TOKENS, split: str = "words",
              max_token_length: int | None = None) -> Tokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 style byte alphabet, so any text encodes without unknowns).

    texts: the corpus (task sources, demonstrations). `special_tokens` get ids 0.. in order. split: "words" or
    "digits" (see SPLITS). max_token_length: longest merged token in characters (None = no limit).
    Raises ValueError when vocab_size cannot hold the 256 byte symbols plus the special tokens, or for an unknown
    split.
    """
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size {vocab_size} < 256 byte symbols + {len(special_tokens)} special tokens")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    tok = tokenizers.Tokenizer(models.BPE())
    if split == "words":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pieces = [pre_tokenizers.Digits(individual_digits=True),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        if split == "lines":
            pieces.insert(0, pre_tokenizers.Split(tokenizers.Regex(LINE_PIECES), behavior="isolated"))
        tok.pre_tokenizer = pre_tokenizers.Sequence(pieces)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  **({"max_token_length": max_token_length} if max_token_length else {}))
    tok.train_from_iterator(texts, trainer)
    return Tokenizer(tok, "<trained byte-level BPE>")
