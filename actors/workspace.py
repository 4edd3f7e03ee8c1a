"""The agent's workspace on the actor side: the solution's files as text, with the sandbox's path rules applied
at write time, so that a bad write gets an observation that says what is allowed (the episode goes on).

Writable: `model_new.py` and `kernels/<name>` (one level, a suffix of the solution format, see
`actors.skill.KERNEL_SUFFIXES`); readable: those plus `model.py`, the reference (read-only). Bounds as in
sandbox/FORMATS.md: at most 32 files of at most 256 KiB each.
"""

from __future__ import annotations

import re

from actors.skill import KERNEL_SUFFIXES

MAX_FILES = 32
MAX_FILE_BYTES = 256 * 1024
REFERENCE = "model.py"
ENTRY = "model_new.py"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


class WorkspaceRuleError(ValueError):
    """A write the rules refuse; the message is the observation the agent gets."""


class AgentWorkspace:
    """Files of one episode's solution. fmt: "cubin" | "extension" | "cpu"; reference: model.py's text."""

    def __init__(self, reference: str, fmt: str):
        if fmt not in KERNEL_SUFFIXES:
            raise ValueError(f"unknown solution format {fmt!r}")
        self.fmt = fmt
        self.reference = reference
        self.files: dict[str, str] = {}

    def check_path(self, path: object) -> str:
        """The path if the agent may write it; WorkspaceRuleError saying why not."""
        suffixes = ", ".join(KERNEL_SUFFIXES[self.fmt])
        allowed = f"only {ENTRY} and kernels/<file> with a suffix in ({suffixes}) can be written"
        if not isinstance(path, str) or not path:
            raise WorkspaceRuleError(f"'path' must be a non-empty string; {allowed}")
        if path == REFERENCE:
            raise WorkspaceRuleError(f"{REFERENCE} is the reference and is read-only; {allowed}")
        parts = path.split("/")
        if path.startswith("/") or "\\" in path or "\0" in path or any(p in ("", ".", "..") for p in parts):
            raise WorkspaceRuleError(f"{path[:200]!r} is outside the workspace or not a plain relative path; {allowed}")
        if path == ENTRY:
            return path
        if len(parts) != 2 or parts[0] != "kernels":
            raise WorkspaceRuleError(f"{path[:200]!r} cannot be written: {allowed}")
        name = parts[1]
        if not _NAME.match(name):
            raise WorkspaceRuleError(f"{path[:200]!r}: file names may use letters, digits, '_', '.', '-' only")
        if not name.endswith(KERNEL_SUFFIXES[self.fmt]):
            raise WorkspaceRuleError(f"{path[:200]!r}: files under kernels/ must end in one of ({suffixes}) for the "
                                     f"{self.fmt} format")
        return path

    def write(self, path: object, content: object) -> str:
        """Create or replace a file; returns a one-line confirmation. Raises WorkspaceRuleError."""
        path = self.check_path(path)
        if not isinstance(content, str):
            raise WorkspaceRuleError(f"'content' must be a string (the whole file text), got {type(content).__name__}")
        size = len(content.encode("utf-8", "surrogatepass"))
        if size > MAX_FILE_BYTES:
            raise WorkspaceRuleError(f"{path}: {size} bytes is over the limit of {MAX_FILE_BYTES} bytes per file")
        if "\0" in content:
            raise WorkspaceRuleError(f"{path}: content contains a NUL character")
        if path not in self.files and len(self.files) >= MAX_FILES:
            raise WorkspaceRuleError(f"the workspace already holds {MAX_FILES} files, the most allowed")
        existed = path in self.files
        self.files[path] = content
        lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
        return f"{'replaced' if existed else 'created'} {path} ({lines} lines, {size} bytes)"

    def read(self, path: object, max_chars: int) -> str:
        """A file's text (cut at max_chars with a note). Raises WorkspaceRuleError for an unknown file."""
        if path == REFERENCE:
            text = self.reference
        elif isinstance(path, str) and path in self.files:
            text = self.files[path]
        else:
            have = ", ".join([REFERENCE, *sorted(self.files)])
            raise WorkspaceRuleError(f"no file {str(path)[:200]!r} in the workspace (files: {have})")
        if len(text) > max_chars:
            return text[:max_chars] + f"\n... [{len(text) - max_chars} more characters not shown]"
        return text

    def listing(self) -> str:
        rows = [f"{REFERENCE} ({len(self.reference.encode())} bytes, read-only reference)"]
        rows += [f"{p} ({len(t.encode('utf-8', 'surrogatepass'))} bytes)" for p, t in sorted(self.files.items())]
        if ENTRY not in self.files:
            rows.append(f"({ENTRY} does not exist yet)")
        return "\n".join(rows)

    def snapshot(self) -> dict[str, str]:
        """A copy of the solution's files (what a sandbox job carries)."""
        return dict(self.files)
