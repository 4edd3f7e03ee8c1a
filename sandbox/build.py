"""Build a solution's kernels: host compiler -> shared library (cpu), nvcc -> cubin (cubin),
torch.utils.cpp_extension -> Python extension module (extension, workspace layout).

- Compilers run confined like the candidate (sandbox.jail: read-only root, no network, sandbox uid) with the
  workspace as their only writable folder. The same folders are hidden as for the candidate: the repository
  except its `sandbox` package, the build cache, the load_inline caches, other workspaces and the host's scratch
  and home folders. The workspace's reference copy is concealed. The environment is a minimal one
  (`build_env`). A hostile `#include "/etc/shadow"`, an `.incbin` of a pristine reference or of
  /proc/self/environ, or a compiler plugin therefore gains nothing.
- Build cache: keyed by sha256 over format, source files, flags, target architecture and toolchain versions.
  Entries live under `<cache_dir>/builds/<key>/` (root-owned, mode 0700: candidates cannot read or poison them);
  a hit copies the artefacts into the workspace's `.build/`. Failed builds are cached too (same sources, same
  diagnostics).
- Diagnostics come back with workspace-relative paths (`kernels/x.cu:12:3: error: ...`), truncated to
  `SandboxConfig.compile_log_max_chars`.
- The manifest (`.build/manifest.json`, read by `sandbox.runtime`) lists each artefact with the entry points
  parsed from the sources (sandbox.signature).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sandbox.config import SandboxConfig
from sandbox.jail import DEFAULT_HIDE, PASSED_ENV, JailSpec, candidate_expose, command_prefix, toolkit_dirs, trusted_roots
from sandbox.result import Violation
from sandbox.signature import SignatureError, parse_entry_points
from sandbox.static_check import check_instructions, check_symbols
from sandbox.workspace import Workspace

REPO_ROOT = Path(__file__).resolve().parent.parent
INCLUDE_DIR = Path(__file__).resolve().parent / "include"
"""Headers the sandbox ships for cpu and cubin solutions (`#include "cuda_agent.h"`, see sandbox/FORMATS.md); on
the include path of those builds, after the solution's own kernels/ folder."""


@functools.cache
def _shipped_headers() -> str:
    """sha256 over the shipped headers (part of the build cache key: a changed header rebuilds)."""
    h = hashlib.sha256()
    for p in sorted(INCLUDE_DIR.glob("*.h")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@dataclasses.dataclass
class BuildResult:
    """Outcome of a build.

    Fields:
      ok: artefacts exist and passed the symbol check.
      status: "" when ok, else "compile_error" | "forbidden" | "timeout".
      log: diagnostics (truncated, workspace-relative). cached: taken from the build cache.
      manifest_path: the workspace's .build/manifest.json ("" when there is nothing to load).
      violations: symbol allow-list violations (status "forbidden"). elapsed_ms: wall time of this call.
      key: the cache key.
    """

    ok: bool
    status: str = ""
    log: str = ""
    cached: bool = False
    manifest_path: str = ""
    violations: list[Violation] = dataclasses.field(default_factory=list)
    elapsed_ms: float = 0.0
    key: str = ""


def truncate_log(text: str, ws: Path | None, limit: int) -> str:
    """Workspace-relative paths and at most `limit` characters (head kept: the first errors matter most)."""
    if ws is not None:
        for p in {str(ws), os.path.realpath(ws)}:
            text = text.replace(p + "/", "").replace(p, ".")
    text = text.strip()
    if len(text) > limit:
        cut = len(text) - limit
        text = text[:limit] + f"\n... [{cut} more characters truncated]"
    return text


@functools.cache
def _tool_version(tool: str) -> str:
    exe = shutil.which(tool)
    if not exe:
        return f"{tool}:missing"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return f"{tool}:unknown"
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return f"{tool}:{lines[-1] if tool == 'nvcc' else lines[0] if lines else '?'}"


@functools.cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown-cpu"


def detect_arch(cfg: SandboxConfig) -> str:
    """nvcc target: cfg.cuda_arch, else from the first GPU via NVML (9.0 -> sm_90a), else cfg.default_cuda_arch."""
    if cfg.cuda_arch:
        return cfg.cuda_arch
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
        finally:
            pynvml.nvmlShutdown()
        suffix = "a" if major >= 9 else ""
        return f"sm_{major}{minor}{suffix}"
    except Exception:  # noqa: BLE001 - no NVML binding: ask nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.split()
        major, minor = out[0].split(".")
        return f"sm_{major}{minor}{'a' if int(major) >= 9 else ''}"
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        return cfg.default_cuda_arch


def cache_key(fmt: str, files: dict[str, str], flags: list[str], toolchain: list[str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"fmt": fmt, "flags": flags, "toolchain": toolchain, "files": sorted(files.items())},
                        sort_keys=True).encode())
    return h.hexdigest()


class _Runner:
    """Runs build commands in the workspace, confined when a jail spec is given."""

    def __init__(self, ws: Workspace, jail: JailSpec | None, timeout_s: float):
        self.ws = ws
        self.jail = jail
        self.deadline = time.monotonic() + timeout_s
        self.env = build_env(ws)

    def run(self, argv: list[str]) -> tuple[int, str]:
        """(returncode, combined output); returncode -9 and a note on timeout."""
        if self.jail is not None:
            argv = command_prefix() + [sys.executable, "-m", "sandbox.jail", self.jail.to_json(), "--"] + argv
        left = self.deadline - time.monotonic()
        if left <= 0:
            return -9, "build time limit reached"
        p = subprocess.Popen(argv, cwd=self.ws.path, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            import signal

            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = p.communicate()
            return -9, (out or "") + "\nbuild time limit reached"
        return p.returncode, out or ""


def build_env(ws: Workspace) -> dict[str, str]:
    """The compilers' environment: PATH, the workspace as HOME and (its .tmp) TMPDIR, the PYTHONPATH the jail's
    entry and extension builds import from, and sandbox.jail.PASSED_ENV; nothing else of the trusted side's."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ws.path), "TMPDIR": str(ws.path / ".tmp"),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                            if p]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    return env


def _store(cache_root: Path, key: str, build_dir: Path, record: dict[str, Any]) -> None:
    """Copy artefacts + record into the cache atomically (rename of a finished temp folder)."""
    builds = cache_root / "builds"
    builds.mkdir(parents=True, exist_ok=True)
    os.chmod(cache_root, 0o700)
    final = builds / key
    if final.exists():
        return
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=builds))
    for a in record["artifacts"]:
        shutil.copy2(build_dir / a["file"], tmp / a["file"])
    (tmp / "record.json").write_text(json.dumps(record))
    try:
        os.rename(tmp, final)
    except OSError:  # another process stored the same key first
        shutil.rmtree(tmp, ignore_errors=True)


def _load_cached(cache_root: Path, key: str) -> dict[str, Any] | None:
    rec = cache_root / "builds" / key / "record.json"
    if not rec.exists():
        return None
    try:
        return json.loads(rec.read_text())
    except (OSError, ValueError):
        return None


def _write_manifest(ws: Workspace, fmt: str, record: dict[str, Any]) -> str:
    arts = []
    for a in record["artifacts"]:
        arts.append({**a, "path": str(ws.build_dir / a["file"])})
    m = ws.build_dir / "manifest.json"
    m.write_text(json.dumps({"format": fmt, "artifacts": arts}))
    ws.chown_build()
    return str(m)


def build(ws: Workspace, fmt: str, cfg: SandboxConfig, jail: JailSpec | None, arch: str = "") -> BuildResult:
    """Build the workspace's kernels for `fmt`. Never raises for the candidate's faults: they are statuses.

    Args:
      ws: the workspace (sources already laid out). fmt: "cpu" | "cubin" | "extension".
      jail: confinement for the compiler processes (None: unconfined). arch: nvcc target (cubin/extension).
    """
    t0 = time.perf_counter()
    files = ws.kernel_files()
    limit = cfg.compile_log_max_chars
    if fmt == "extension" and not any(p.endswith("_binding.cpp") for p in files):
        # KernelBench load_inline layout: model_new.py builds its own module at import time.
        return BuildResult(ok=True, log="", manifest_path="", elapsed_ms=(time.perf_counter() - t0) * 1e3)
    sources = {p: s for p, s in files.items() if p.endswith({"cpu": (".c", ".cpp", ".cc", ".cxx"),
                                                            "cubin": (".cu",), "extension": (".cu", ".cpp", ".cc")}[fmt])}
    if not sources:
        return BuildResult(ok=False, status="compile_error",
                           log=f"no kernel sources under kernels/ for the {fmt} format",
                           elapsed_ms=(time.perf_counter() - t0) * 1e3)
    entry: dict[str, list] = {}
    if fmt in ("cpu", "cubin"):
        seen: dict[str, str] = {}
        try:
            for p, s in sorted(sources.items()):
                sigs = parse_entry_points(s, p)
                for sig in sigs:
                    if sig.name in seen:
                        raise SignatureError(f"entry point {sig.name} is defined in both {seen[sig.name]} and {p}")
                    seen[sig.name] = p
                entry[p] = [sig.to_dict() for sig in sigs]
        except SignatureError as e:
            return BuildResult(ok=False, status="compile_error", log=str(e), elapsed_ms=(time.perf_counter() - t0) * 1e3)
        if not seen:
            return BuildResult(ok=False, status="compile_error",
                               log='no entry points found: declare kernels extern "C"' +
                                   (" __global__" if fmt == "cubin" else "") + " void name(...)",
                               elapsed_ms=(time.perf_counter() - t0) * 1e3)
    if fmt == "cpu":
        flags = shlex.split(cfg.cpu_cflags)
        toolchain = [_tool_version(cfg.cc), _tool_version(cfg.cxx), _cpu_model(), _shipped_headers()]
    elif fmt == "cubin":
        flags = ["-cubin", f"-arch={arch}"] + shlex.split(cfg.nvcc_flags)
        toolchain = [_tool_version(cfg.nvcc), _shipped_headers()]
    else:
        import torch

        flags = [f"arch={arch}", "-O3"]
        toolchain = [_tool_version(cfg.nvcc), _tool_version(cfg.cxx), f"torch:{torch.__version__}"]
    key = cache_key(fmt, files, flags, toolchain)
    cache_root = Path(cfg.cache_dir)
    rec = _load_cached(cache_root, key)
    if rec is not None:
        for a in rec["artifacts"]:
            shutil.copy2(cache_root / "builds" / key / a["file"], ws.build_dir / a["file"])
        res = BuildResult(ok=rec["ok"], status=rec["status"], log=rec["log"], cached=True, key=key,
                          violations=[Violation(**v) for v in rec.get("violations", [])])
        if rec["ok"]:
            res.manifest_path = _write_manifest(ws, fmt, rec)
        res.elapsed_ms = (time.perf_counter() - t0) * 1e3
        return res
    timeout = cfg.extension_build_timeout_s if fmt == "extension" else cfg.build_timeout_s
    runner = _Runner(ws, jail, timeout)
    if fmt == "cpu":
        rec = _build_cpu(runner, ws, cfg, sources, flags, entry)
    elif fmt == "cubin":
        rec = _build_cubin(runner, ws, cfg, sources, flags, entry)
    else:
        rec = _build_extension(runner, ws, cfg, files, arch, key)
    rec["log"] = truncate_log(rec["log"], ws.path, limit)
    if rec["ok"] and fmt == "cpu":
        so = str(ws.build_dir / rec["artifacts"][0]["file"])
        viol = check_symbols(so, cfg.allow_blas) or check_instructions(so)
        if viol:
            rec.update(ok=False, status="forbidden", violations=[v.to_dict() for v in viol])
    if rec["status"] != "timeout":
        _store(cache_root, key, ws.build_dir, rec)
    res = BuildResult(ok=rec["ok"], status=rec["status"], log=rec["log"], cached=False, key=key,
                      violations=[Violation(**v) for v in rec.get("violations", [])])
    if rec["ok"]:
        res.manifest_path = _write_manifest(ws, fmt, rec)
    res.elapsed_ms = (time.perf_counter() - t0) * 1e3
    return res


def _fail(code: int, log: str) -> dict[str, Any]:
    return {"ok": False, "status": "timeout" if code == -9 else "compile_error", "log": log, "artifacts": []}


def _build_cpu(r: _Runner, ws: Workspace, cfg: SandboxConfig, sources: dict[str, str], flags: list[str],
               entry: dict[str, list]) -> dict[str, Any]:
    logs, objs = [], []
    for p in sorted(sources):
        obj = f".build/{Path(p).name}.o"
        if p.endswith(".c"):
            argv = [cfg.cc, "-std=gnu11", *flags, "-Ikernels", f"-I{INCLUDE_DIR}", "-c", p, "-o", obj]
        else:
            argv = [cfg.cxx, "-std=gnu++17", *flags, "-Ikernels", f"-I{INCLUDE_DIR}", "-c", p, "-o", obj]
        code, out = r.run(argv)
        logs.append(out)
        if code != 0:
            return _fail(code, "\n".join(logs))
        objs.append(obj)
    code, out = r.run([cfg.cxx, "-shared", *flags, *objs, "-o", ".build/libkernels.so"])
    logs.append(out)
    if code != 0:
        return _fail(code, "\n".join(logs))
    eps = [sig for p in sorted(entry) for sig in entry[p]]
    return {"ok": True, "status": "", "log": "\n".join(logs),
            "artifacts": [{"file": "libkernels.so", "kind": "so", "entry_points": eps}]}


def _build_cubin(r: _Runner, ws: Workspace, cfg: SandboxConfig, sources: dict[str, str], flags: list[str],
                 entry: dict[str, list]) -> dict[str, Any]:
    logs, arts = [], []
    for p in sorted(sources):
        out_file = f"{Path(p).stem}.cubin"
        code, out = r.run([cfg.nvcc, *flags, "-Ikernels", f"-I{INCLUDE_DIR}", "-o", f".build/{out_file}", p])
        logs.append(out)
        if code != 0:
            return _fail(code, "\n".join(logs))
        if entry.get(p):
            arts.append({"file": out_file, "kind": "cubin", "entry_points": entry[p]})
    return {"ok": True, "status": "", "log": "\n".join(logs), "artifacts": arts}


_EXT_SCRIPT = """
import sys, glob, json
from torch.utils.cpp_extension import load
name, arch, build_dir = sys.argv[1], sys.argv[2], sys.argv[3]
srcs = sorted(glob.glob('kernels/*.cu') + glob.glob('kernels/*.cpp') + glob.glob('kernels/*.cc'))
cuda = any(s.endswith('.cu') for s in srcs)
num = arch.replace('sm_', '').replace('a', '')
kw = dict(extra_cflags=['-O3'], verbose=False, build_directory=build_dir)
if cuda:
    kw['extra_cuda_cflags'] = ['-O3']
load(name=name, sources=srcs, **kw)
"""


def _build_extension(r: _Runner, ws: Workspace, cfg: SandboxConfig, files: dict[str, str], arch: str,
                     key: str) -> dict[str, Any]:
    bindings = [p for p in files if p.endswith("_binding.cpp")]
    if len(bindings) != 1:
        return _fail(1, f"the extension workspace layout needs exactly one kernels/*_binding.cpp, found {len(bindings)}")
    name = f"sbx_ext_{key[:16]}"
    bdir = ws.path / ".build" / "ext"
    bdir.mkdir(exist_ok=True)
    if ws.owner_uid > 0:
        os.chown(bdir, ws.owner_uid, ws.owner_uid)
    r.env["TORCH_CUDA_ARCH_LIST"] = torch_arch_list(arch)
    r.env["MAX_JOBS"] = str(max(1, min(8, os.cpu_count() or 1)))
    code, out = r.run([sys.executable, "-c", _EXT_SCRIPT, name, arch, str(bdir)])
    so = bdir / f"{name}.so"
    if code != 0 or not so.exists():
        return _fail(code if code != 0 else 1, out)
    shutil.copy2(so, ws.build_dir / f"{name}.so")
    return {"ok": True, "status": "", "log": out,
            "artifacts": [{"file": f"{name}.so", "kind": "ext", "module_name": name, "entry_points": []}]}


def torch_arch_list(arch: str) -> str:
    """nvcc target -> TORCH_CUDA_ARCH_LIST entry: "sm_90a" -> "9.0", "sm_80" -> "8.0" (the arch-specific "a"
    features are not used by extension builds; plain entries are accepted by every torch version)."""
    digits = "".join(ch for ch in arch.removeprefix("sm_").removeprefix("compute_") if ch.isdigit())
    return f"{digits[:-1]}.{digits[-1]}"


def build_dir_for_dev(src_dir: Path, fmt: str) -> str:
    """Outside the sandbox: build `src_dir` (a kernels/ folder) unconfined and return the manifest path."""
    cfg = SandboxConfig()
    root = Path(tempfile.mkdtemp(prefix="cuda-agent-dev-"))
    files = {f"kernels/{p.name}": p.read_text() for p in sorted(Path(src_dir).iterdir()) if p.is_file()}
    ws = Workspace.create(root, "", {"model_new.py": "", **files}, fmt)
    res = build(ws, fmt, cfg, None, detect_arch(cfg))
    if not res.ok:
        raise RuntimeError(f"build of {src_dir} failed ({res.status}):\n{res.log}")
    return res.manifest_path


def jail_for_build(ws: Workspace, cfg: SandboxConfig) -> JailSpec:
    """The confinement used for compiler processes of one workspace: the candidate's (reference_worker.candidate_jail)
    but for the compilers' folders and rlimits (see module doc)."""
    return JailSpec(workspace=str(ws.path), uid=cfg.sandbox_uid if ws.owner_uid > 0 else -1,
                    expose=candidate_expose() + toolkit_dirs() + _compiler_paths(cfg),
                    hide=list(DEFAULT_HIDE) + trusted_roots(cfg.cache_dir, str(cfg.workspaces_dir)),
                    conceal=[str(ws.model_py)],
                    rlimits={"fsize_bytes": 1 << 30, "nofile": cfg.rlimit_nofile})


def _compiler_paths(cfg: SandboxConfig) -> list[str]:
    out = []
    for tool in (cfg.cc, cfg.cxx, cfg.nvcc, "ninja"):
        exe = shutil.which(tool)
        if exe:
            out.append(os.path.dirname(os.path.realpath(exe)))
    return out
