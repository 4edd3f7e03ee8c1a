"""The built-in task set, shipped as package data.

Splits (plain functions, no registry):
  - "single_op": about 20 hand-written, hand-checked single-operator tasks (elementwise, reductions,
    softmax, norms, matmul, conv, pooling, scan, loss), CPU-sized; files in `single_op/`.
  - "cpu_train", "cpu_eval": synthesized + filtered tasks sized for the CPU backend (eager 0.1-20 ms at
    one thread on the 2-core build machine, measured; metadata["eager_ms"]).
  - "gpu_train", "gpu_eval": synthesized + filtered tasks of the same kind re-sized for the GPU window
    (1-100 ms eager on an H200), measured there by the filter (`python -m tasks.builtin.measure_gpu` writes the
    measurement in: metadata["eager_ms"], metadata["gpu_timing_status"] "measured" / "contended"; the sizing's
    roofline estimate stays in metadata["eager_ms_estimate_h200"]; tasks the GPU filter rejected are dropped,
    MANIFEST.json's "gpu_measured" says which and why). metadata["cpu_shape_params"] gives a small size at which they were checked on a
    CPU; `at_cpu_size(task)` returns that version.
  - "cpu_family_train", "cpu_family_eval": synthesized + filtered (same filter, CPU-sized) compositions of only
    the operators the demonstration generator covers (tasks.demos.ir's fused family), so that every training task
    has a demonstration and the evaluation tasks are new compositions of the same operators: what a small model
    trained from scratch can learn and generalise on (the `local` preset of `cuda-agent train`).
  The eval splits are fixed and never receive demonstrations.

Rebuild with `python -m tasks.builtin.build` and `python -m tasks.builtin.build_family` (see those modules); the
files here are their output.
"""

from __future__ import annotations

from pathlib import Path

from tasks.schema import Task

HERE = Path(__file__).resolve().parent
SPLITS = ("single_op", "cpu_train", "cpu_eval", "gpu_train", "gpu_eval", "cpu_family_train", "cpu_family_eval")
TRAIN_SPLITS = ("single_op", "cpu_train", "gpu_train", "cpu_family_train")
EVAL_SPLITS = ("cpu_eval", "gpu_eval", "cpu_family_eval")


def split_path(name: str) -> Path:
    """File (or folder, for single_op) of a split. Raises ValueError for an unknown split."""
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; known: {', '.join(SPLITS)}")
    return HERE / "single_op" if name == "single_op" else HERE / f"{name}.jsonl"


# Hand-checked single-operator tasks: id -> (category, operator).
SINGLE_OP = {
    "op_relu": ("activation", "relu"), "op_gelu": ("activation", "gelu"), "op_sigmoid": ("activation", "sigmoid"),
    "op_tanh": ("activation", "tanh"), "op_add": ("elementwise", "add"), "op_axpy": ("elementwise", "axpy"),
    "op_sum_over_rows": ("reduction", "sum"), "op_mean_over_rows": ("reduction", "mean"),
    "op_max_over_rows": ("reduction", "amax"), "op_softmax": ("softmax", "softmax"),
    "op_logsoftmax": ("softmax", "log_softmax"), "op_layernorm": ("normalization", "layer_norm"),
    "op_rmsnorm": ("normalization", "rms_norm"), "op_matmul_square": ("matmul", "matmul"),
    "op_matmul_rectangular": ("matmul", "matmul"), "op_linear": ("matmul", "linear"),
    "op_batched_matmul": ("matmul", "bmm"), "op_conv2d": ("conv", "conv2d"), "op_maxpool2d": ("pooling", "max_pool2d"),
    "op_avgpool2d": ("pooling", "avg_pool2d"), "op_cumsum": ("scan", "cumsum"), "op_mseloss": ("loss", "mse_loss"),
    "op_l2normalize": ("normalization", "l2_normalize"),
}


def _single_op() -> list[Task]:
    from tasks.loaders import load_py_folder, slug

    out = []
    for t in load_py_folder(HERE / "single_op"):
        name = t.name.split("_", 1)[1] if "_" in t.name else t.name
        tid = f"op_{slug(name)}"
        category, op = SINGLE_OP[tid]
        out.append(t.replace(id=tid, name=name, source="builtin", level=1, category=category, operators=(op,),
                             metadata={**t.metadata, "split": "single_op", "depth": 1},
                             provenance={**t.provenance, "path": f"tasks/builtin/single_op/{t.name}.py"}))
    return out


def load_split(name: str) -> list[Task]:
    """Tasks of one split, in file order. Raises ValueError for an unknown split, FileNotFoundError when the
    split's file has not been built."""
    from tasks.loaders import load_jsonl

    path = split_path(name)
    if name == "single_op":
        return _single_op()
    if not path.exists():
        raise FileNotFoundError(f"{path}: built-in split {name!r} is not built (python -m tasks.builtin.build)")
    return load_jsonl(path)


def load_all() -> list[Task]:
    """Every task of every built split."""
    out: list[Task] = []
    for name in SPLITS:
        try:
            out.extend(load_split(name))
        except FileNotFoundError:
            continue
    return out


def at_cpu_size(task: Task) -> Task:
    """A GPU-sized task re-instantiated at the small sizes it was checked at on a CPU (others unchanged)."""
    from tasks.reference import with_shape_params

    small = task.metadata.get("cpu_shape_params")
    if not small:
        return task
    return task.replace(reference=with_shape_params(task.reference, small, task.id), shape_params=dict(small))
