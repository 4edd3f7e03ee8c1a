"""Compose 2-5 seed operators into one fused task (paper: data synthesis by combining seed operators).

`GraphComposer` samples a chain around an *anchor* operator of a requested category: shape-preserving
fillers before it (so the anchor stays applicable), any applicable ops after it, a terminal op (a loss)
only last. Shapes are tracked symbolically (`tasks.graph`), so every composition is valid by construction;
the result is rendered as a KernelBench-format reference whose module-level int constants are its shape
parameters. The task's category is the anchor's.

`tasks.llm_compose.LLMComposer` offers the same `compose(index, category, depth)` call through a language
model; both satisfy the `Composer` protocol, and `tasks.synthesize` takes either.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Callable, Protocol

from tasks.categories import CATEGORIES
from tasks.graph import Builder, Value
from tasks.operators import REGISTRY, NotApplicable, OpSpec, SizeProfile, start_value
from tasks.schema import Task

COMPOSER_VERSION = 1

# How often each category is picked as a filler around the anchor (relative weights).
FILLER_WEIGHTS = {
    "elementwise": 3.0, "activation": 3.0, "normalization": 2.0, "reduction": 1.0, "softmax": 1.0,
    "pooling": 1.0, "layout": 0.7, "scan": 0.5, "matmul": 0.7, "conv": 0.7, "attention": 0.4, "loss": 0.5,
}


# Sign bookkeeping, so that the composer does not emit operators that are the identity on their input
# (the filter would reject them as `no_effect_op`; avoiding them raises the acceptance rate).
NONNEG_OUTPUT = frozenset({
    "relu", "relu6", "sigmoid", "softplus", "hardsigmoid", "abs", "square", "exp", "sqrt", "rsqrt", "reciprocal",
    "log1p", "softmax", "softmin", "vector_norm", "std", "var", "pairwise_distance", "mse_loss", "l1_loss",
    "smooth_l1_loss", "huber_loss", "bce_with_logits", "soft_margin_loss", "cross_entropy", "kl_div",
    "local_response_norm",
})
KEEPS_NONNEG = frozenset({
    "max_pool1d", "avg_pool1d", "max_pool2d", "avg_pool2d", "max_pool3d", "avg_pool3d", "adaptive_avg_pool2d",
    "adaptive_avg_pool1d", "adaptive_max_pool2d", "lp_pool2d", "sum", "mean", "amax", "amin", "max_dim",
    "cumsum", "cummax", "cummin", "cumprod", "flip", "roll", "pad", "upsample_nearest", "upsample_bilinear",
    "pixel_shuffle", "pixel_unshuffle", "transpose", "flatten", "scale", "hardtanh", "clamp", "relu6", "sqrt",
    "maximum", "l2_normalize", "sdpa", "sdpa_causal", "sdpa_cross",
})
IDENTITY_ON_NONNEG = frozenset({"relu", "prelu", "leaky_relu", "elu", "celu", "abs", "relu6"})
# (previous, next) pairs where `next` makes `previous` pointless.
REDUNDANT_PAIRS = frozenset({
    ("log_softmax", "cross_entropy"), ("log_softmax", "kl_div"), ("log_softmax", "log_softmax"),
    ("neg", "abs"), ("neg", "square"), ("neg", "cos"), ("abs", "square"), ("relu", "relu6"),
    ("sigmoid", "hardsigmoid"), ("flip", "cumsum"), ("roll", "softmax"), ("roll", "sum"), ("flip", "sum"),
    ("roll", "mean"), ("flip", "mean"), ("roll", "amax"), ("flip", "amax"), ("roll", "logsumexp"),
})


def nonneg_after(op: str, was_nonneg: bool) -> bool:
    """Whether the running value is known to be >= 0 after `op`."""
    return op in NONNEG_OUTPUT or (was_nonneg and op in KEEPS_NONNEG)


def redundant(prev: str | None, op: str, nonneg: bool) -> bool:
    """`op` would have no effect on (or undo the effect of) what precedes it."""
    return (nonneg and op in IDENTITY_ON_NONNEG) or (prev, op) in REDUNDANT_PAIRS


class ComposeError(RuntimeError):
    """No valid composition was found for the request (category, depth) within the attempt budget."""


class Composer(Protocol):
    """Anything that turns (index, category, depth) into a candidate task. Raises ComposeError."""

    def compose(self, index: int, category: str | None = None, depth: int | None = None) -> Task: ...


@dataclass
class ComposeConfig:
    """Settings of the graph composer.

    Fields:
      seed: base seed; candidate `index` is drawn from Random(f"{seed}:{index}:{attempt}"), so the same
        (seed, index, category, depth) always gives the same task.
      min_depth, max_depth: number of operators per task (inclusive), 2-5 as in the paper.
      max_attempts: attempts per request before ComposeError.
      profile: sizes of new axes and the numel / parameter limits.
    """

    seed: int = 0
    min_depth: int = 2
    max_depth: int = 5
    max_attempts: int = 40
    profile: SizeProfile = field(default_factory=SizeProfile)

    def __post_init__(self) -> None:
        if not 1 <= self.min_depth <= self.max_depth:
            raise ValueError(f"need 1 <= min_depth <= max_depth, got {self.min_depth}, {self.max_depth}")


START_LAYOUTS = ("rows", "seq", "ncl", "nchw", "ncdhw")


def _weighted_choice(rng: random.Random, ops: list[OpSpec]) -> OpSpec:
    weights = [FILLER_WEIGHTS.get(o.category, 1.0) / max(1, _CAT_SIZES[o.category]) for o in ops]
    return rng.choices(ops, weights=weights, k=1)[0]


_CAT_SIZES: dict[str, int] = {}
for _op in REGISTRY:
    _CAT_SIZES[_op.category] = _CAT_SIZES.get(_op.category, 0) + 1


class GraphComposer:
    """Random, shape-checked composition of registry operators. See the module docstring."""

    def __init__(self, config: ComposeConfig | None = None, registry: tuple[OpSpec, ...] = REGISTRY,
                 accept: Callable[[str], bool] | None = None):
        """registry: the operators to compose; accept: an extra test of each rendered reference source (e.g.
        "the demonstration generator covers it"); an attempt it refuses counts as a failed attempt."""
        self.config = config or ComposeConfig()
        self.registry = registry
        self.accept = accept
        self.categories = sorted({op.category for op in registry}, key=CATEGORIES.index)

    # one attempt ------------------------------------------------------------------------------------------
    def _try_apply(self, b: Builder, x: Value, op: OpSpec, rng: random.Random) -> tuple[Builder, Value] | None:
        trial = copy.deepcopy(b)
        try:
            out = op.apply(trial, x, rng, self.config.profile)
        except NotApplicable:
            return None
        if out.numel > self.config.profile.max_numel:
            return None
        return trial, out

    def _attempt(self, rng: random.Random, category: str, depth: int) -> tuple[Builder, OpSpec] | None:
        anchors = [op for op in self.registry if op.category == category]
        anchor = rng.choice(anchors)
        starts = [lay for lay in START_LAYOUTS if lay in anchor.layouts]
        pos = depth - 1 if anchor.terminal else rng.randrange(depth)
        if not starts:  # the anchor needs a derived layout (e.g. vec): put it after at least one op
            starts, pos = list(START_LAYOUTS), max(pos, 1)
        b = Builder()
        x = start_value(b, rng.choice(starts), rng)
        last: str | None = None
        nonneg = False
        for i in range(depth):
            final = i == depth - 1
            if i == pos:
                pool = [anchor] if anchor.applicable(x) and not redundant(last, anchor.name, nonneg) else []
            elif i < pos:
                pool = [o for o in self.registry if o.preserves_shape and o.category != category
                        and o.applicable(x) and o.name != last and not redundant(last, o.name, nonneg)]
                if not anchor.layouts & {x.layout}:  # keep the anchor reachable
                    pool = []
            else:
                pool = [o for o in self.registry if o.applicable(x) and o.name != last
                        and (final or not o.terminal) and not redundant(last, o.name, nonneg)]
            applied = None
            for _ in range(8):
                if not pool:
                    break
                op = _weighted_choice(rng, pool) if i != pos else anchor
                applied = self._try_apply(b, x, op, rng)
                if applied is not None:
                    break
                pool = [o for o in pool if o is not op]
            if applied is None:
                return None
            b, x = applied
            last = b.ops[-1]
            nonneg = nonneg_after(last, nonneg)
            if x.layout == "scalar" and not final:
                return None
        if pos >= depth:
            return None
        return b, anchor

    # public -----------------------------------------------------------------------------------------------
    def compose(self, index: int, category: str | None = None, depth: int | None = None) -> Task:
        """A candidate task for `index` (deterministic given the config's seed). Raises ComposeError."""
        cfg = self.config
        if category is not None and category not in self.categories:
            raise ValueError(f"unknown category {category!r}; known: {self.categories}")
        for attempt in range(cfg.max_attempts):
            rng = random.Random(f"{cfg.seed}:{index}:{attempt}")
            cat = category or rng.choice(self.categories)
            d = depth or rng.randint(cfg.min_depth, cfg.max_depth)
            got = self._attempt(rng, cat, d)
            if got is None:
                continue
            b, anchor = got
            task_id = f"syn_s{cfg.seed}_{index:06d}"
            doc = (f"{' -> '.join(b.ops)}\n\nSynthesized task {task_id}: {len(b.ops)} operators around a {cat} "
                   f"anchor ({anchor.name}).")
            source = b.render(doc)
            if self.accept is not None and not self.accept(source):
                continue
            return Task(
                id=task_id,
                name="_".join(b.ops),
                reference=source,
                source="synthesized",
                level=2,
                category=cat,
                operators=tuple(b.ops),
                shape_params=dict(b.params),
                metadata={"depth": len(b.ops), "anchor": anchor.name, "op_categories": list(b.categories),
                          "size": "cpu", "op_lines": [list(x) for x in b.op_lines],
                          "op_preserves_shape": list(b.op_preserves)},
                provenance={"composer": "graph", "composer_version": COMPOSER_VERSION, "seed": cfg.seed,
                            "index": index, "attempt": attempt},
            )
        raise ComposeError(f"no valid composition for index {index} (category {category}, depth {depth}) "
                           f"in {cfg.max_attempts} attempts")
