"""The task record shared by the sandbox, the synthesis pipeline, the actors and the learner.

A task is a PyTorch reference in KernelBench format: a module source that defines `class Model(nn.Module)`,
`get_inputs()` and `get_init_inputs()`. Shape parameters are module-level integer constants of that source
(e.g. `batch_size = 16`) that `get_inputs` / `get_init_inputs` read; the sandbox may re-instantiate a task
with other values for them (verification on other shapes) by overriding those globals before calling
`get_init_inputs()` / `get_inputs()`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Literal

TaskSource = Literal["synthesized", "kernelbench", "user", "builtin"]
_SOURCES = frozenset(("synthesized", "kernelbench", "user", "builtin"))


@dataclasses.dataclass(frozen=True)
class Task:
    """One kernel-writing task.

    Fields:
      id: stable identifier, unique within a task set (e.g. "kb_l1_19_relu", "syn_000123").
      name: human-readable name.
      reference: Python source text of the reference module (defines Model, get_inputs, get_init_inputs).
      source: where the task comes from (synthesized / kernelbench / user / builtin).
      level: KernelBench level (1 single op, 2 fused ops, 3 architectures); 0 when unknown.
      category: main operator category (elementwise, reduction, normalization, matmul, conv, pooling, ...).
      operators: operator names in the order the reference applies them.
      shape_params: names and default values of the module-level int constants that fix the input shapes.
      atol, rtol: correctness tolerances (default 1e-2 each, as KernelBench).
      metadata: free-form extra information (input shapes, eager times in ms, estimates, ...).
      dtype: dtype of the floating-point inputs (e.g. "float32").
      provenance: where the record came from: origin file or composer, seed, time of creation, tool version.

    Validation of the reference source (syntax, `Model`, `get_inputs`, running it) lives in
    `tasks.validate`; this record only checks its own field types.
    """

    id: str
    name: str
    reference: str
    source: TaskSource = "user"
    level: int = 0
    category: str = ""
    operators: tuple[str, ...] = ()
    shape_params: dict[str, int] = dataclasses.field(default_factory=dict)
    atol: float = 1e-2
    rtol: float = 1e-2
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("id", "name", "reference"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"task field {name!r} must be a non-empty string, got {value!r:.60}")
        if self.source not in _SOURCES:
            raise ValueError(f"task {self.id}: source must be one of {sorted(_SOURCES)}, got {self.source!r}")
        for k, v in self.shape_params.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"task {self.id}: shape_params must map names to ints, got {k!r}: {v!r}")

    @property
    def content_hash(self) -> str:
        """sha256 hex digest of the reference source (whitespace kept: it is what runs)."""
        return hashlib.sha256(self.reference.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["operators"] = list(self.operators)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        """Build from a plain dict (JSONL row, msgpack map). Raises ValueError naming a missing/unknown field."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"task record has unknown field(s): {sorted(unknown)}")
        for req in ("id", "name", "reference"):
            if req not in d:
                raise ValueError(f"task record is missing required field {req!r}")
        d = dict(d)
        d["operators"] = tuple(d.get("operators", ()))
        return cls(**d)

    def replace(self, **changes: Any) -> "Task":
        """A copy with some fields changed (the record is frozen)."""
        return dataclasses.replace(self, **changes)
