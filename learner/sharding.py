"""Device mesh (data, fsdp, tensor) and partition rules from the model's logical axis names.

The model annotates each parameter with logical axis names (`nnx.with_partitioning(init, ("embed", "mlp"))`,
stored as the variable's `out_sharding` metadata). Rules map each logical name to a mesh axis:

    vocab -> tensor, embed -> fsdp, q_heads -> tensor, kv_heads -> tensor, head_dim -> replicated,
    mlp -> tensor

A dimension falls back to replicated when its size is not divisible by the mesh axis, or when the mesh axis is
already used by an earlier dimension of the same array (e.g. a grouped-query model with 2 kv heads on a
tensor axis of 4). Optimiser moments mirror their parameters (Optax keeps the variables' metadata); scalars
are replicated. Batches are split over rows on (data, fsdp).

All meshes use `AxisType.Auto` (XLA's sharding propagation), which any model works with.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from learner.config import MeshConfig

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
DEFAULT_RULES: tuple[tuple[str, str | None], ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
)


def mesh_shape(cfg: MeshConfig, n_devices: int) -> tuple[int, int, int]:
    """Resolve the -1 axis of `cfg` for `n_devices`. Raises ValueError when the sizes do not multiply out."""
    sizes = [cfg.data, cfg.fsdp, cfg.tensor]
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n_devices % known:
            raise ValueError(f"mesh {tuple(sizes)} (data, fsdp, tensor): {n_devices} devices not divisible by {known}")
        sizes[sizes.index(-1)] = n_devices // known
    if math.prod(sizes) != n_devices:
        raise ValueError(f"mesh {tuple(sizes)} (data, fsdp, tensor) needs {math.prod(sizes)} devices, have {n_devices}")
    return tuple(sizes)  # type: ignore[return-value]


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all global devices, every process's)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(cfg, len(devices))
    auto = (jax.sharding.AxisType.Auto,) * 3
    try:
        return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)
    except Exception:  # device order the topology helper cannot place (e.g. a hand-picked subset)
        return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES, axis_types=auto)


def logical_to_spec(
    names: Sequence[str | None] | None,
    shape: Sequence[int],
    mesh: Mesh,
    rules: Sequence[tuple[str, str | None]] = DEFAULT_RULES,
) -> PartitionSpec:
    """PartitionSpec for one array with logical axis `names` (None / missing = replicated).

    Raises ValueError when `names` has a different length than `shape`.
    """
    if not names:
        return PartitionSpec()
    if len(names) != len(shape):
        raise ValueError(f"logical axes {tuple(names)} do not match an array of shape {tuple(shape)}")
    table: Mapping[str, str | None] = dict(rules)
    used: set[str] = set()
    out: list[str | None] = []
    for name, size in zip(names, shape):
        axis = table.get(name) if name is not None else None
        if axis is None or axis in used or mesh.shape[axis] == 1 or size % mesh.shape[axis]:
            out.append(None)
            continue
        used.add(axis)
        out.append(axis)
    return PartitionSpec(*out)


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def tree_shardings(tree: Any, mesh: Mesh, rules: Sequence[tuple[str, str | None]] = DEFAULT_RULES) -> Any:
    """NamedShardings for every array of `tree` (nnx.State, Optax state, TrainState, ...): variables follow
    their `out_sharding` logical names through `rules`, any other array is replicated. Works on concrete
    arrays and on `jax.ShapeDtypeStruct`s."""

    def one(x):
        if _is_var(x):
            names = x.get_metadata().get("out_sharding")
            spec = logical_to_spec(names, x.get_value().shape, mesh, rules)
            return x.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, tree, is_leaf=_is_var)


def shard_tree(tree: Any, mesh: Mesh, rules: Sequence[tuple[str, str | None]] = DEFAULT_RULES) -> Any:
    """`tree` with each array placed according to `tree_shardings`."""
    return jax.device_put(tree, tree_shardings(tree, mesh, rules))


def abstract_with_shardings(tree: Any, mesh: Mesh, rules: Sequence[tuple[str, str | None]] = DEFAULT_RULES) -> Any:
    """`tree` (concrete or abstract) as `jax.ShapeDtypeStruct`s that carry their target shardings: the restore
    target for Orbax on `mesh`."""
    shardings = tree_shardings(tree, mesh, rules)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def init_sharded(make_model: Callable[[], nnx.Module], mesh: Mesh, rules=DEFAULT_RULES) -> nnx.Module:
    """Build the model with every parameter created directly in its shard (no full copy on one device).

    `make_model` is called under `nnx.use_eager_sharding(False)`; the layout comes from `rules`.
    """

    def build():
        with nnx.use_eager_sharding(False):
            return make_model()

    abstract = nnx.eval_shape(build)
    graphdef, abs_state = nnx.split(abstract)
    shardings = tree_shardings(abs_state, mesh, rules)

    def create():
        return nnx.split(build())[1]

    state = jax.jit(create, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def batch_sharding(mesh: Mesh, ndim: int, row_axis: int = 0) -> NamedSharding:
    """Sharding of a batch array whose dimension `row_axis` holds rows (sequences): rows over (data, fsdp)."""
    spec = [None] * ndim
    spec[row_axis] = BATCH_AXES
    return NamedSharding(mesh, PartitionSpec(*spec))


def shard_batch(tree: Any, mesh: Mesh, row_axis: int = 0) -> Any:
    """Place every array of a batch pytree with rows on (data, fsdp). Raises ValueError when the row count is
    not divisible by data * fsdp."""
    n_shards = mesh.shape["data"] * mesh.shape["fsdp"]

    def put(x):
        if x.shape[row_axis] % n_shards:
            raise ValueError(f"batch dimension {row_axis} of shape {x.shape} is not divisible by data*fsdp={n_shards}")
        return jax.device_put(x, batch_sharding(mesh, x.ndim, row_axis))

    return jax.tree.map(put, tree)


def describe(tree: Any) -> dict[str, str]:
    """`path -> PartitionSpec` of a sharded tree, for logs and tests."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        sh = getattr(leaf, "sharding", None)
        out[jax.tree_util.keystr(path)] = str(getattr(sh, "spec", sh))
    return out
