"""Read tasks and solutions from disk (the `sandbox eval` command and the test corpus).

Task on disk: a `model.py` file (KernelBench reference), or a folder holding `model.py` and optionally
`task.json` (fields of tasks.schema.Task other than `reference`), or a `.json` task record with `reference`.
Solution on disk: a folder holding `model_new.py` and optionally `kernels/`, or a single `model_new.py`-style
file (KernelBench `load_inline` solutions).
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.schema import Task


def load_task(path: str | Path) -> Task:
    """Raises FileNotFoundError / ValueError naming what is missing or malformed."""
    p = Path(path)
    if p.is_dir():
        ref = p / "model.py"
        if not ref.exists():
            raise FileNotFoundError(f"{p}: a task folder needs model.py")
        meta: dict = {}
        if (p / "task.json").exists():
            meta = json.loads((p / "task.json").read_text())
        meta.setdefault("id", p.name)
        meta.setdefault("name", meta["id"])
        meta["reference"] = ref.read_text()
        return Task.from_dict(meta)
    if p.suffix == ".json":
        return Task.from_dict(json.loads(p.read_text()))
    if p.suffix == ".py":
        return Task(id=p.stem, name=p.stem, reference=p.read_text())
    raise ValueError(f"{p}: not a task (expected a folder with model.py, a .py reference or a .json record)")


def load_solution(path: str | Path) -> dict[str, str]:
    """{workspace-relative path: text}. Raises FileNotFoundError when there is no model_new.py."""
    p = Path(path)
    if p.is_file():
        return {"model_new.py": p.read_text()}
    if not (p / "model_new.py").exists():
        raise FileNotFoundError(f"{p}: a solution folder needs model_new.py")
    files = {"model_new.py": (p / "model_new.py").read_text()}
    kdir = p / "kernels"
    if kdir.is_dir():
        for f in sorted(kdir.iterdir()):
            if f.is_file():
                files[f"kernels/{f.name}"] = f.read_text()
    return files


def guess_format(files: dict[str, str], backend: str) -> str:
    """cpu on the cpu backend unless the files say extension; cubin for .cu without a binding file."""
    names = list(files)
    if any(n.endswith("_binding.cpp") for n in names) or "load_inline" in files.get("model_new.py", ""):
        return "extension"
    if any(n.endswith(".cu") for n in names):
        return "cubin"
    return "cpu" if backend == "cpu" else "cubin"
