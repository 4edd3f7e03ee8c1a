"""Seed operator mining: enumerate torch's operators and report which ones our registry can drive.

Enumerated namespaces:
  - `torch.nn` modules: public classes of torch.nn that subclass nn.Module;
  - `torch.nn.functional`: public functions;
  - torch tensor ops: public functions of the `torch` namespace implemented in C++
    (`torch._C._VariableFunctions`) plus a few Python-level ones, and public methods of `torch.Tensor`.

An operator is *drivable* when a registry entry (`tasks.operators.REGISTRY`) names it and a one-operator
probe graph built from that entry runs in eager mode here. `mine()` returns the counts and the lists.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tasks.graph import Builder
from tasks.operators import REGISTRY, START_DIMS, NotApplicable, OpSpec, SizeProfile, start_value


@dataclass
class MiningReport:
    """Result of `mine()`.

    Fields:
      enumerated: namespace -> sorted dotted names found in torch.
      drivable_ops: registry entry names whose probe ran.
      drivable_torch: distinct torch operators (dotted names) those entries drive.
      failed: registry entry name -> why it is not drivable (missing in this torch, probe error).
      by_category: category -> number of drivable registry entries.
    """

    enumerated: dict[str, list[str]] = field(default_factory=dict)
    drivable_ops: list[str] = field(default_factory=list)
    drivable_torch: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    by_category: dict[str, int] = field(default_factory=dict)

    @property
    def n_enumerated(self) -> int:
        return len({n for names in self.enumerated.values() for n in names})

    def summary(self) -> str:
        parts = ", ".join(f"{k} {len(v)}" for k, v in self.enumerated.items())
        return (f"enumerated {self.n_enumerated} torch operators ({parts}); drivable: "
                f"{len(self.drivable_ops)} registry operators over {len(self.drivable_torch)} distinct torch "
                f"operators in {len(self.by_category)} categories")


def enumerate_torch() -> dict[str, list[str]]:
    """Dotted names of torch operators by namespace (see the module docstring)."""
    import inspect

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    modules = sorted(
        f"torch.nn.{n}" for n in dir(nn)
        if not n.startswith("_") and inspect.isclass(getattr(nn, n)) and issubclass(getattr(nn, n), nn.Module)
    )
    functional = sorted(
        f"torch.nn.functional.{n}" for n in dir(F)
        if not n.startswith("_") and callable(getattr(F, n)) and not inspect.isclass(getattr(F, n))
        and not inspect.ismodule(getattr(F, n)) and getattr(getattr(F, n), "__module__", "") != "typing"
    )
    c_funcs = {n for n in dir(torch._C._VariableFunctions) if not n.startswith("_")}
    py_funcs = {n for n in ("einsum", "cdist", "norm", "chain_matmul", "tensordot", "stft", "unique", "split",
                            "broadcast_tensors", "block_diag", "cartesian_prod", "meshgrid", "atleast_1d")
                if hasattr(torch, n)}
    tensor_ops = sorted(f"torch.{n}" for n in c_funcs | py_funcs)
    linalg = sorted(f"torch.linalg.{n}" for n in dir(torch.linalg) if not n.startswith("_")
                    and callable(getattr(torch.linalg, n)))
    methods = sorted(f"torch.Tensor.{n}" for n in dir(torch.Tensor) if not n.startswith("_")
                     and callable(getattr(torch.Tensor, n, None)))
    return {"torch.nn modules": modules, "torch.nn.functional": functional, "torch": tensor_ops,
            "torch.linalg": linalg, "torch.Tensor methods": methods}


def probe(op: OpSpec, tries: int = 12, profile: SizeProfile | None = None) -> str | None:
    """Build a one-op graph from each start layout the op accepts and run it; None on success, else why."""
    from tasks.validate import TaskValidationError, check_runtime

    profile = profile or SizeProfile()
    layouts = [lay for lay in START_DIMS if lay in op.layouts]
    if not layouts:
        return f"no start layout among {sorted(op.layouts)}"
    last = "not applicable to any probe input"
    for i in range(tries):
        rng = random.Random(f"probe:{op.name}:{i}")
        b = Builder()
        x = start_value(b, layouts[i % len(layouts)], rng)
        if not op.applicable(x):
            continue
        try:
            op.apply(b, x, rng, profile)
        except NotApplicable as e:
            last = str(e)
            continue
        try:
            check_runtime(b.render(f"probe of {op.name}"), f"<probe {op.name}>", determinism=False)
            return None
        except TaskValidationError as e:
            last = str(e)
    return last


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for p in parts[i:]:
                obj = getattr(obj, p)
        except AttributeError:
            return False
        return True
    return False


def mine(registry: tuple[OpSpec, ...] = REGISTRY, run_probes: bool = True) -> MiningReport:
    """Enumerate torch's operators and check every registry entry (name resolves, is enumerated, probe runs)."""
    rep = MiningReport(enumerated=enumerate_torch())
    known = {n for names in rep.enumerated.values() for n in names}
    torch_ops = set()
    for op in registry:
        if not _resolves(op.torch_name):
            rep.failed[op.name] = f"{op.torch_name} does not exist in this torch"
            continue
        if op.torch_name not in known:
            rep.failed[op.name] = f"{op.torch_name} is not among the enumerated operators"
            continue
        why = probe(op) if run_probes else None
        if why is not None:
            rep.failed[op.name] = why
            continue
        rep.drivable_ops.append(op.name)
        torch_ops.add(op.torch_name)
        rep.by_category[op.category] = rep.by_category.get(op.category, 0) + 1
    rep.drivable_torch = sorted(torch_ops)
    return rep
