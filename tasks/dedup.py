"""Near-duplicate detection within a task set and against a benchmark folder (contamination).

Two tasks are near-duplicates when
  - their normalised operator sequences (tasks.trace: canonical aten op names in dispatch order) are equal
    and their sources are at least `same_ops_similarity` similar, or
  - their sources alone are at least `source_similarity` similar (a near-verbatim copy), or
  - their references are byte-identical.

Source similarity is difflib's ratio over normalised token streams of the `Model` class (the part that says
what is computed; comments and docstrings dropped, number literals -> NUM, string literals -> STR,
identifiers and operators kept), so renamed sizes or changed constants do not hide a copy. Candidate pairs come from buckets of equal operator sequences plus a MinHash
LSH index over token 4-grams (16 bands x 4 rows: pairs above about 0.5 Jaccard collide), so checking one task
costs a few comparisons, not one per indexed task.
"""

from __future__ import annotations

import difflib
import io
import tokenize
import zlib
from dataclasses import dataclass

import numpy as np

_BANDS, _ROWS = 16, 4
_PRIME = (1 << 61) - 1
_rng = np.random.default_rng(20260229)
_A = _rng.integers(1, _PRIME, size=_BANDS * _ROWS, dtype=np.uint64)
_B = _rng.integers(0, _PRIME, size=_BANDS * _ROWS, dtype=np.uint64)


def computation_text(source: str) -> str:
    """The part of a reference that defines what it computes: the `Model` class (the whole text otherwise).

    Imports, size constants and the get_inputs / get_init_inputs boilerplate are alike in every task and
    would make unrelated short tasks look similar.
    """
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            seg = ast.get_source_segment(source, node)
            if seg:
                return seg
    return source


def normalized_tokens(source: str) -> list[str]:
    """Token stream used for similarity (see the module docstring). Unparseable text falls back to words."""
    source = computation_text(source)
    out: list[str] = []
    try:
        prev_significant = None
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER, tokenize.ENCODING):
                if tok.type == tokenize.NEWLINE:
                    prev_significant = None
                continue
            if tok.type == tokenize.STRING:
                if prev_significant is None:  # a docstring / bare string statement
                    continue
                out.append("STR")
            elif tok.type == tokenize.NUMBER:
                out.append("NUM")
            else:
                out.append(tok.string)
            prev_significant = tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source.split()
    return out


def similarity(a: list[str], b: list[str]) -> float:
    """difflib ratio of two token lists, in [0, 1]."""
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def _minhash(tokens: list[str]) -> np.ndarray:
    grams = {" ".join(tokens[i:i + 4]) for i in range(max(1, len(tokens) - 3))}
    h = np.array([zlib.crc32(g.encode()) for g in grams], dtype=np.uint64)
    # (a * h + b) mod p per permutation; uint64 wraps, which keeps the family pseudo-random enough here
    v = (_A[:, None] * h[None, :] + _B[:, None]) % np.uint64(_PRIME)
    return v.min(axis=1)


@dataclass
class Match:
    """A near-duplicate found: the indexed key, why, and the source similarity."""

    key: str
    reason: str  # "identical", "same_ops", "similar_source"
    similarity: float


@dataclass
class _Entry:
    key: str
    signature: tuple[str, ...]
    tokens: list[str]
    digest: str


class DedupIndex:
    """An incremental index of tasks for near-duplicate queries (thresholds in the module docstring)."""

    def __init__(self, same_ops_similarity: float = 0.5, source_similarity: float = 0.95):
        if not (0 <= same_ops_similarity <= 1 and 0 <= source_similarity <= 1):
            raise ValueError("similarity thresholds must lie in [0, 1]")
        self.same_ops_similarity = same_ops_similarity
        self.source_similarity = source_similarity
        self._entries: list[_Entry] = []
        self._by_sig: dict[tuple[str, ...], list[int]] = {}
        self._by_digest: dict[str, int] = {}
        self._bands: list[dict[bytes, list[int]]] = [dict() for _ in range(_BANDS)]

    def __len__(self) -> int:
        return len(self._entries)

    def _band_keys(self, tokens: list[str]) -> list[bytes]:
        mh = _minhash(tokens)
        return [mh[i * _ROWS:(i + 1) * _ROWS].tobytes() for i in range(_BANDS)]

    def add(self, key: str, signature: tuple[str, ...] | list[str], source: str) -> None:
        import hashlib

        tokens = normalized_tokens(source)
        e = _Entry(key, tuple(signature), tokens, hashlib.sha256(source.encode()).hexdigest())
        i = len(self._entries)
        self._entries.append(e)
        self._by_digest.setdefault(e.digest, i)
        if e.signature:
            self._by_sig.setdefault(e.signature, []).append(i)
        for band, k in zip(self._bands, self._band_keys(tokens)):
            band.setdefault(k, []).append(i)

    def find(self, signature: tuple[str, ...] | list[str], source: str) -> Match | None:
        """The best near-duplicate of (signature, source) in the index, or None."""
        import hashlib

        digest = hashlib.sha256(source.encode()).hexdigest()
        if digest in self._by_digest:
            return Match(self._entries[self._by_digest[digest]].key, "identical", 1.0)
        tokens = normalized_tokens(source)
        signature = tuple(signature)
        best: Match | None = None
        for i in self._by_sig.get(signature, []) if signature else []:
            s = similarity(tokens, self._entries[i].tokens)
            if s >= self.same_ops_similarity and (best is None or s > best.similarity):
                best = Match(self._entries[i].key, "same_ops", s)
        if best is not None:
            return best
        seen: set[int] = set()
        for band, k in zip(self._bands, self._band_keys(tokens)):
            seen.update(band.get(k, ()))
        for i in sorted(seen):
            s = similarity(tokens, self._entries[i].tokens)
            if s >= self.source_similarity and (best is None or s > best.similarity):
                best = Match(self._entries[i].key, "similar_source", s)
        return best


def signature_of(source: str, origin: str = "<reference>") -> tuple[str, ...]:
    """The normalised operator sequence of a reference (traced on the meta device; executes the source)."""
    from tasks.trace import trace_source

    return trace_source(source, origin).signature


def benchmark_index(folder, same_ops_similarity: float = 0.5, source_similarity: float = 0.95) -> DedupIndex:
    """A DedupIndex of every task in a benchmark folder (any layout `tasks.loaders.load_tasks` reads).

    Tasks whose forward cannot be traced on meta tensors are indexed by source only. Loader errors propagate.
    """
    from tasks.loaders import load_tasks

    idx = DedupIndex(same_ops_similarity, source_similarity)
    for t in load_tasks(folder):
        try:
            sig = signature_of(t.reference, t.provenance.get("path", t.id))
        except Exception:
            sig = ()
        idx.add(t.id, sig, t.reference)
    return idx
