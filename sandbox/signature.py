"""Parse the `extern "C"` entry points of a solution's kernel sources (cubin and cpu formats).

The launcher (`sandbox.runtime`) needs each entry point's parameter list to pass torch tensors as pointers and
Python numbers as C scalars of the right width. This module reads it from the source text, without a compiler:

- `.cu`, `.cpp`, `.cc`, `.cxx`: a function is an entry point when its definition carries `extern "C"` or sits
  inside an `extern "C" { ... }` block; in `.cu` files it must also be `__global__`.
- `.c`: every top-level `void` function definition that is not `static`.

Entry points return `void`. Parameters are pointers to one of the element types in `ELEMENT_TYPES` (or
`void*`, which accepts any dtype) or scalars of one of the types in `SCALAR_TYPES`. Anything else is a
`SignatureError` that names the function and parameter.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# C element type -> torch dtype name (pointers). "any" for void*.
ELEMENT_TYPES: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "__half": "float16",
    "__nv_bfloat16": "bfloat16",
    "nv_bfloat16": "bfloat16",
    "int": "int32",
    "signed": "int32",
    "signed int": "int32",
    "int32_t": "int32",
    "unsigned": "int32",
    "unsigned int": "int32",
    "uint32_t": "int32",
    "long": "int64",
    "long int": "int64",
    "long long": "int64",
    "long long int": "int64",
    "int64_t": "int64",
    "ptrdiff_t": "int64",
    "ssize_t": "int64",
    "size_t": "int64",
    "uint64_t": "int64",
    "unsigned long": "int64",
    "unsigned long long": "int64",
    "short": "int16",
    "int16_t": "int16",
    "char": "int8",
    "signed char": "int8",
    "int8_t": "int8",
    "unsigned char": "uint8",
    "uint8_t": "uint8",
    "bool": "bool",
    "void": "any",
}

# C scalar type -> (kind, bits, signed). kind: "int" | "float" | "bool".
SCALAR_TYPES: dict[str, tuple[str, int, bool]] = {
    "float": ("float", 32, True),
    "double": ("float", 64, True),
    "int": ("int", 32, True),
    "signed": ("int", 32, True),
    "signed int": ("int", 32, True),
    "int32_t": ("int", 32, True),
    "unsigned": ("int", 32, False),
    "unsigned int": ("int", 32, False),
    "uint32_t": ("int", 32, False),
    "long": ("int", 64, True),
    "long int": ("int", 64, True),
    "long long": ("int", 64, True),
    "long long int": ("int", 64, True),
    "int64_t": ("int", 64, True),
    "ptrdiff_t": ("int", 64, True),
    "ssize_t": ("int", 64, True),
    "size_t": ("int", 64, False),
    "uint64_t": ("int", 64, False),
    "unsigned long": ("int", 64, False),
    "unsigned long long": ("int", 64, False),
    "short": ("int", 16, True),
    "int16_t": ("int", 16, True),
    "char": ("int", 8, True),
    "signed char": ("int", 8, True),
    "int8_t": ("int", 8, True),
    "unsigned char": ("int", 8, False),
    "uint8_t": ("int", 8, False),
    "bool": ("bool", 8, False),
}

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "std::", "__const__"}


class SignatureError(ValueError):
    """A kernel entry point has a return type, parameter type or shape the launcher cannot handle."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an entry point.

    Fields:
      name: parameter name ("" when unnamed).
      ctype: the C base type with qualifiers removed (e.g. "float", "int64_t").
      pointer: True for a pointer parameter (a torch tensor is passed), False for a scalar.
      const: True when the pointee (pointer) or value (scalar) is declared const.
      dtype: torch dtype name the pointer expects ("float32", ..., "any"); "" for scalars.
    """

    name: str
    ctype: str
    pointer: bool
    const: bool
    dtype: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Param":
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class KernelSignature:
    """An entry point: `name(params...)`, found in `file` (workspace-relative), `kind` "global" or "host"."""

    name: str
    params: tuple[Param, ...]
    file: str
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": [p.to_dict() for p in self.params], "file": self.file, "kind": self.kind}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelSignature":
        return cls(d["name"], tuple(Param.from_dict(p) for p in d["params"]), d["file"], d["kind"])

    def describe(self) -> str:
        return f"{self.name}(" + ", ".join(
            ("const " if p.const else "") + p.ctype + ("*" if p.pointer else "") + (f" {p.name}" if p.name else "")
            for p in self.params
        ) + ")"


def strip_comments(src: str) -> str:
    """Remove // and /* */ comments and string/char literal contents (keeps `extern "C"` intact)."""
    out: list[str] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c == "/" and i + 1 < n and src[i + 1] == "/":
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif c == "/" and i + 1 < n and src[i + 1] == "*":
            j = src.find("*/", i + 2)
            out.append(" ")
            i = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            lit = src[i : j + 1]
            out.append('"C"' if lit == '"C"' else c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _strip_preprocessor(src: str) -> str:
    lines = src.split("\n")
    out, cont = [], False
    for line in lines:
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


_ATTR_RE = re.compile(r"__launch_bounds__\s*\([^()]*\)|__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)|__declspec\s*\([^()]*\)")
_DEF_RE = re.compile(r"^(?P<prefix>.*?)\b(?P<ret>[A-Za-z_][\w:]*)\s*(?P<ptr>\**)\s*\b(?P<name>[A-Za-z_]\w*)\s*\((?P<params>[^()]*)\)\s*$", re.S)


def _parse_param(fn: str, text: str) -> Param | None:
    t = " ".join(text.replace("*", " * ").replace("&", " & ").split())
    if t in ("", "void"):
        return None
    if "&" in t or "[" in t or "(" in t:
        raise SignatureError(f"{fn}: parameter {text.strip()!r}: references, arrays and function pointers are not supported")
    toks = t.split(" ")
    stars = toks.count("*")
    if stars > 1:
        raise SignatureError(f"{fn}: parameter {text.strip()!r}: pointers to pointers are not supported")
    const = False
    star_at = toks.index("*") if stars else len(toks)
    base: list[str] = []
    for k, tok in enumerate(toks):
        if tok == "*":
            continue
        if tok in ("const", "__const__"):
            if k < star_at or not stars:
                const = True
            continue
        if tok in _QUALIFIERS:
            continue
        base.append(tok)
    # The last identifier after the type words is the name, when there is one.
    name = ""
    if stars:
        after = [tk for tk in toks[star_at + 1 :] if tk not in _QUALIFIERS and tk not in ("const", "__const__")]
        before = [tk for tk in toks[:star_at] if tk not in _QUALIFIERS and tk not in ("const", "__const__")]
        base = before
        name = after[-1] if after else ""
    else:
        if len(base) > 1 and " ".join(base) not in SCALAR_TYPES:
            name = base[-1]
            base = base[:-1]
    ctype = " ".join(base)
    if stars:
        if ctype not in ELEMENT_TYPES:
            raise SignatureError(f"{fn}: parameter {text.strip()!r}: pointer to unsupported type {ctype!r}")
        return Param(name, ctype, True, const, ELEMENT_TYPES[ctype])
    if ctype not in SCALAR_TYPES:
        raise SignatureError(f"{fn}: parameter {text.strip()!r}: unsupported scalar type {ctype!r} (use one of int, int64_t, float, double, ...)")
    return Param(name, ctype, False, const, "")


def parse_entry_points(src: str, file: str) -> list[KernelSignature]:
    """Entry points of one source file, in source order.

    Args:
      src: the file's text.
      file: its workspace-relative path (e.g. "kernels/softmax.cu"); the suffix picks the rules (see module doc).
    Raises:
      SignatureError: an entry point that does not return void or has a parameter the launcher cannot pass.
    """
    is_c = file.endswith(".c")
    is_cu = file.endswith((".cu", ".cuh"))
    text = _ATTR_RE.sub(" ", _strip_preprocessor(strip_comments(src)))
    found: list[KernelSignature] = []
    i, n = 0, len(text)
    header_start = 0
    extern_depth: list[int] = []  # brace depths at which an extern "C" block opened
    depth = 0
    while i < n:
        c = text[i]
        if c == ";":
            header_start = i + 1
        elif c == "}":
            if extern_depth and extern_depth[-1] == depth:
                extern_depth.pop()
            else:
                depth -= 1
            header_start = i + 1
        elif c == "{":
            header = text[header_start:i].strip()
            if re.fullmatch(r'extern\s*"C"', header):
                extern_depth.append(depth)
                header_start = i + 1
                i += 1
                continue
            m = _DEF_RE.match(header)
            in_extern_block = bool(extern_depth)
            if m and depth == 0 and "=" not in header and m.group("name") not in ("if", "for", "while", "switch"):
                prefix = " ".join(m.group("prefix").split())
                ret = m.group("ret")
                marked = 'extern "C"' in re.sub(r'extern\s*"C"', 'extern "C"', prefix) or in_extern_block
                exported = (not is_c and marked) or (is_c and "static" not in prefix.split())
                is_global = "__global__" in prefix.split()
                if exported and (not is_cu or is_global) and "__device__" not in prefix.split():
                    if ret != "void" or m.group("ptr"):
                        raise SignatureError(f"{file}: entry point {m.group('name')} must return void, not {ret}{m.group('ptr')}")
                    fn = f"{file}: {m.group('name')}"
                    params = [p for p in (_parse_param(fn, s) for s in m.group("params").split(",")) if p is not None]
                    found.append(KernelSignature(m.group("name"), tuple(params), file, "global" if is_cu else "host"))
            # skip the body
            d = 1
            j = i + 1
            while j < n and d:
                if text[j] == "{":
                    d += 1
                elif text[j] == "}":
                    d -= 1
                j += 1
            i = j
            header_start = j
            continue
        i += 1
    return found
