"""Fill a loaded task's derived fields by running it: operators, category, shapes, FLOPs and bytes.

Executes the reference in the calling process (see `tasks.filtering` for a worker pool).
"""

from __future__ import annotations

from tasks.categories import infer_category
from tasks.schema import Task
from tasks.trace import trace_module
from tasks.validate import check_runtime, load_checked, origin_of


def analyze(task: Task, runtime: bool = True, determinism: bool = True) -> Task:
    """Validate (statically, and by running it unless `runtime=False`) and fill derived fields.

    Sets, when empty: `operators` (the normalised operator sequence from tasks.trace), `category` (from it).
    Adds to metadata: `input_shapes`, `output_shapes`, `output_dtypes` (runtime), `flops`, `bytes` (trace on
    the meta device; skipped with `trace_error` recorded if the reference cannot run on meta tensors).
    Raises TaskValidationError.
    """
    origin = origin_of(task)
    meta = dict(task.metadata)
    if runtime:
        info = check_runtime(task.reference, origin, determinism=determinism)
        meta.update(input_shapes=info.input_shapes, output_shapes=info.output_shapes,
                    output_dtypes=info.output_dtypes)
    mod = load_checked(task.reference, origin)
    signature: tuple[str, ...] = ()
    try:
        tr = trace_module(mod, device="meta")
        signature = tr.signature
        meta.update(flops=tr.total_flops, bytes=tr.total_bytes)
        meta.pop("trace_error", None)
    except Exception as e:  # data-dependent code or an op without a meta kernel
        meta["trace_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    changes: dict = {"metadata": meta}
    if not task.operators and signature:
        changes["operators"] = signature
    if not task.category and signature:
        changes["category"] = infer_category(signature)
    return task.replace(**changes)
