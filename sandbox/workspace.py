"""Per-evaluation workspaces: `model.py` (read-only reference copy), `model_new.py`, `kernels/`, `.build/`, `.tmp/`.

Workspaces live under `SandboxConfig.workspaces_dir` (mode 0711, root-owned: not listable), each in a folder with
a random 128-bit name, mode 0700, owned by the sandbox uid when the candidate runs under namespace isolation, so
one candidate cannot find or read another's files. The checker never reads `model.py` back: it keeps the
pristine reference in memory.

The spill folder of an evaluation (`io_dir`, large tensors between the trusted side and the candidate,
sandbox.wire.SpillDir) is not inside the workspace, which the candidate owns and could rename entries of: it is
the workspace's sibling `<name>.io` in the root-owned workspaces folder, owned by the sandbox uid too (the
candidate writes its outputs there), so the candidate cannot rename it or put a symlink in its place.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path, PurePosixPath

MAX_FILES = 32
MAX_FILE_BYTES = 256 * 1024

SUFFIXES = {
    "cpu": {".c", ".cpp", ".cc", ".cxx", ".h", ".hpp"},
    "cubin": {".cu", ".cuh", ".h"},
    "extension": {".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp"},
}


class WorkspaceError(ValueError):
    """The solution's file set breaks the layout rules (bad path, suffix, size, missing model_new.py)."""


def validate_files(files: dict[str, str], fmt: str) -> None:
    """Raise WorkspaceError naming the first file that breaks the rules of sandbox/FORMATS.md."""
    if fmt not in SUFFIXES:
        raise WorkspaceError(f"unknown format {fmt!r} (expected one of {sorted(SUFFIXES)})")
    if "model_new.py" not in files:
        raise WorkspaceError("the solution has no model_new.py")
    if len(files) > MAX_FILES:
        raise WorkspaceError(f"too many files ({len(files)} > {MAX_FILES})")
    for path, text in files.items():
        if not isinstance(text, str):
            raise WorkspaceError(f"{path}: content must be text")
        if len(text.encode()) > MAX_FILE_BYTES:
            raise WorkspaceError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        p = PurePosixPath(path)
        if path == "model_new.py":
            continue
        if p.is_absolute() or ".." in p.parts or len(p.parts) != 2 or p.parts[0] != "kernels" or \
                p.name.startswith("."):
            raise WorkspaceError(f"{path}: files go in model_new.py or kernels/<name> (no subfolders, no '..')")
        if p.suffix not in SUFFIXES[fmt]:
            raise WorkspaceError(f"{path}: suffix {p.suffix!r} is not allowed in the {fmt} format "
                                 f"(allowed: {sorted(SUFFIXES[fmt])})")


class Workspace:
    """A fresh workspace folder. Use `Workspace.create(...)`, then `.cleanup()` (or keep it for debugging)."""

    def __init__(self, path: Path, owner_uid: int):
        self.path = path
        self.owner_uid = owner_uid

    @property
    def model_py(self) -> Path:
        return self.path / "model.py"

    @property
    def io_dir(self) -> Path:
        """The spill folder (see module doc), beside the workspace."""
        return self.path.parent / (self.path.name + ".io")

    @property
    def build_dir(self) -> Path:
        return self.path / ".build"

    @property
    def kernels_dir(self) -> Path:
        return self.path / "kernels"

    @classmethod
    def create(cls, root: Path, reference: str, files: dict[str, str], fmt: str, owner_uid: int = -1) -> "Workspace":
        """Lay out a workspace under root. owner_uid > 0: chown everything to that uid (namespace isolation).

        Raises WorkspaceError for a bad file set (see validate_files).
        """
        validate_files(files, fmt)
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        path = root / f"ws-{secrets.token_hex(16)}"
        path.mkdir(mode=0o700)
        (path / "kernels").mkdir()
        (path / ".build").mkdir()
        (path / ".tmp").mkdir()
        io = root / (path.name + ".io")
        io.mkdir(mode=0o700)
        if owner_uid > 0:
            os.chown(io, owner_uid, owner_uid)
        for rel, text in files.items():
            (path / rel).write_text(text)
        (path / "model.py").write_text(reference)
        os.chmod(path / "model.py", 0o444)
        ws = cls(path, owner_uid)
        if owner_uid > 0:
            for dirpath, dirnames, filenames in os.walk(path):
                os.chown(dirpath, owner_uid, owner_uid)
                for f in filenames:
                    os.chown(os.path.join(dirpath, f), owner_uid, owner_uid)
        return ws

    def kernel_files(self) -> dict[str, str]:
        """kernels/* as {relative path: text}."""
        return {f"kernels/{p.name}": p.read_text() for p in sorted(self.kernels_dir.iterdir()) if p.is_file()}

    def chown_build(self) -> None:
        """Give files the trusted side wrote into .build/ to the workspace owner."""
        if self.owner_uid > 0:
            for dirpath, _, filenames in os.walk(self.build_dir):
                os.chown(dirpath, self.owner_uid, self.owner_uid)
                for f in filenames:
                    os.chown(os.path.join(dirpath, f), self.owner_uid, self.owner_uid)

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.rmtree(self.io_dir, ignore_errors=True)
