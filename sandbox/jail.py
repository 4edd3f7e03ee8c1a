"""OS-level confinement of untrusted processes (candidate workers and builds), with the standard library only.

Mechanism (`mode="namespaces"`, needs root, as on CI and the GPU hosts):
1. The process is started as `unshare --pid --net --mount --mount-proc --fork --kill-child -- <cmd>`
   (`command_prefix()`): its own PID namespace (it and its children see only each other; when the namespace's
   first process dies the kernel kills every process in it, `setsid` escapes included; `--kill-child` ties that
   first process to `unshare`, which the trusted side kills with the whole process group on a timeout), its own
   network namespace (only a loopback device that is down: no connection leaves it), its own mount namespace.
2. First thing inside (before any untrusted code is imported), `enter(spec)`:
   - binds the workspace on itself so it stays writable, and binds read-only files (the reference copy) read-only;
   - covers the host's scratch and home folders (`JailSpec.hide`: /tmp, /var/tmp, /home, /root, /work, /mnt,
     /media, /srv) with an empty tmpfs and binds back only the paths under them that the evaluation needs (the
     workspace, its spill folder, the interpreter, the repository): other workspaces' names, other users' files and
     checkouts are not even visible; a candidate worker's spec also hides the trusted side's own folders wherever
     they are (`private_roots`: the repository, of which only the `sandbox` package is bound back, with every task's
     pristine reference, the build cache, the load_inline caches, the workspaces' root), so native code of the
     solution, which no in-process monitor sees, cannot open them either;
   - makes the paths of `JailSpec.conceal` unreadable (a folder: an empty read-only tmpfs; a file: an empty file of
     mode 000 bound over it): the candidate's copy of the reference, model.py, which nothing in its process reads;
   - keeps the paths the interpreter needs reachable for the sandbox uid (when an ancestor such as `/root` is
     closed to it, a tmpfs covers that ancestor and only the needed children are bound back in);
   - remounts every other mount read-only (bind remounts: flags of this namespace's mounts only);
   - sets rlimits (CPU time, file size, processes, open files, optionally address space);
   - drops the capability bounding set, changes to the sandbox uid/gid (or stays uid 0 with no capabilities
     when `uid < 0`) and sets no_new_privs.
   Writes outside the workspace then fail with EROFS/EACCES, sockets cannot reach anything, and the trusted
   side's files (build cache, other workspaces: mode 0700, owned by root) cannot be read.

`mode="none"` (no root, or namespaces unavailable): only rlimits and a process group; a result records which
mode was active (`describe()`), so nobody mistakes one for the other.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24

_SKIP_REMOUNT = ("/proc", "/dev", "/sys")
DEFAULT_HIDE = ("/tmp", "/var/tmp", "/home", "/root", "/work", "/mnt", "/media", "/srv")
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024), "MALLOC_TRIM_THRESHOLD_": str(1024 * 1024 * 1024)}
"""glibc malloc with fixed thresholds, for the trusted worker (sandbox.evaluator) and the candidate
(reference_worker._worker_env) alike. With the defaults (dynamic thresholds) a torch CPU op's multi-MiB
intermediates came either from a heap that kept its pages or, when the freed top of the heap was trimmed after each
call, from pages faulted in afresh on every call: the same eager baseline measured 6 ms or 23 ms a call depending on
the heap's layout (corpus elementwise_chain, 2-core CPU box), which gave an honest 1.1x kernel a reward of 0 or 1 at
random. Fixed values switch the dynamic adjustment off: blocks up to 32 MiB (glibc's own dynamic maximum) come
from the heap, and up to 1 GiB of free heap top is kept."""

PASSED_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "LANG")
"""The trusted side's environment variables that confined processes (candidate workers, compilers) inherit: which
devices, where the CUDA toolkit and driver libraries are, the locale. Nothing else of it passes: tokens, keys and
the trusted side's paths stay out (a build could embed /proc/self/environ, e.g. with `.incbin`)."""


def toolkit_dirs() -> list[str]:
    """The existing folders named by LD_LIBRARY_PATH, CUDA_HOME and CUDA_PATH: confined processes load the toolkit
    and driver from them, so they stay visible under hidden roots."""
    return sorted({d for k in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
                   for d in os.environ.get(k, "").split(os.pathsep) if d and os.path.isdir(d)})


class JailError(RuntimeError):
    """Confinement could not be set up (the process must not go on to run untrusted code)."""


@dataclasses.dataclass
class JailSpec:
    """What `enter` does.

    Fields:
      workspace: absolute path that stays writable.
      readonly: absolute paths inside the workspace made read-only (e.g. model.py).
      writable: further absolute paths that stay writable (e.g. a build output folder).
      uid: uid/gid to run as; < 0 keeps uid 0 but drops every capability.
      expose: paths (interpreter, libraries, repository) the uid must be able to reach.
      rlimits: {"cpu_s", "fsize_bytes", "nproc", "nofile", "as_bytes"}; 0 or missing = unchanged.
      hide: folders covered with an empty tmpfs, the needed paths under them (workspace, writable, readonly,
        expose) bound back (see module doc); [] hides nothing. Folders that do not exist are skipped.
      conceal: paths made unreadable (see module doc); ones that do not exist are skipped.
    """

    workspace: str
    readonly: list[str] = dataclasses.field(default_factory=list)
    writable: list[str] = dataclasses.field(default_factory=list)
    uid: int = 65534
    expose: list[str] = dataclasses.field(default_factory=list)
    rlimits: dict[str, int] = dataclasses.field(default_factory=dict)
    hide: list[str] = dataclasses.field(default_factory=list)
    conceal: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, s: str) -> "JailSpec":
        return cls(**json.loads(s))


def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return lib


def _mount(lib: ctypes.CDLL, src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = lib.mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None)
    if rc != 0:
        e = ctypes.get_errno()
        raise JailError(f"mount({src!r}, {target!r}, flags={flags:#x}) failed: {os.strerror(e)}")


def _mountpoints() -> list[tuple[str, set[str]]]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        mp = parts[4].encode().decode("unicode_escape")
        opts = set(parts[5].split(","))
        out.append((mp, opts))
    return out


def _traversable(path: str, uid: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    if uid < 0 or uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    return bool(st.st_mode & stat.S_IXOTH)


def _blocking_ancestor(path: str, uid: int) -> str | None:
    p = Path(path)
    for anc in list(reversed(p.parents))[1:] + [p]:
        if anc == p and not p.is_dir():
            break
        if not _traversable(str(anc), uid):
            return str(anc)
    return None


def _expose(lib: ctypes.CDLL, paths: list[str], uid: int) -> None:
    """Make each path reachable for uid by covering closed ancestors with a tmpfs and binding children back."""
    for _ in range(6):
        blocked: dict[str, set[str]] = {}
        for p in paths:
            anc = _blocking_ancestor(p, uid)
            if anc is None or anc == p:
                continue
            child = Path(p).relative_to(anc).parts[0]
            blocked.setdefault(anc, set()).add(child)
        if not blocked:
            return
        anc = min(blocked, key=len)
        fds = {c: os.open(os.path.join(anc, c), os.O_PATH) for c in blocked[anc]}
        try:
            _mount(lib, "tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
            for c, fd in fds.items():
                target = os.path.join(anc, c)
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.mkdir(target)
                else:
                    open(target, "w").close()
                _mount(lib, f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        finally:
            for fd in fds.values():
                os.close(fd)
    raise JailError(f"could not make {paths} reachable for uid {uid}")


def _hide(lib: ctypes.CDLL, roots: list[str], needed: list[str]) -> None:
    """Cover each root folder with an empty tmpfs and bind the needed paths under it back in (see module doc)."""
    needed = sorted({os.path.realpath(p) for p in needed if p})
    for root in roots:
        if not os.path.isdir(root) or os.path.islink(root):
            continue
        root = os.path.realpath(root)
        keep = [p for p in needed if p == root or p.startswith(root + "/")]
        if root in keep:
            continue  # needed whole
        keep = [p for p in keep if not any(q != p and p.startswith(q + "/") for q in keep) and os.path.lexists(p)]
        fds = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in keep}
        try:
            _mount(lib, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
            for p, fd in fds.items():
                parent = root
                for part in Path(p).relative_to(root).parts[:-1]:
                    parent = os.path.join(parent, part)
                    if not os.path.isdir(parent):
                        os.mkdir(parent, 0o755)
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.mkdir(p, 0o755)
                else:
                    open(p, "w").close()
                _mount(lib, f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
        finally:
            for fd in fds.values():
                os.close(fd)


MNT_DETACH = 2


def _conceal(lib: ctypes.CDLL, paths: list[str]) -> None:
    """Make each path unreadable (see module doc): a folder gets an empty read-only tmpfs of mode 000; a file gets an
    empty file of mode 000 bound over it, read-only (made on a scratch tmpfs mounted over the file's folder for a
    moment, and detached again: the bound file keeps it alive, nothing else shows it)."""
    for p in sorted({os.path.realpath(p) for p in paths if p}):
        if os.path.isdir(p):
            _mount(lib, "tmpfs", p, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=000,size=4k")
            continue
        if not os.path.lexists(p):
            continue
        target = os.open(p, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        scratch = os.path.dirname(p)
        try:
            _mount(lib, "tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700,size=4k")
            try:
                empty = os.path.join(scratch, "empty")
                os.close(os.open(empty, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0))
                os.chmod(empty, 0)
                _mount(lib, empty, f"/proc/self/fd/{target}", None, MS_BIND)
            finally:
                if lib.umount2(scratch.encode(), MNT_DETACH) != 0:
                    raise JailError(f"umount2({scratch!r}) failed: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(target)
        _mount(lib, None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        st = os.stat(p)
        if st.st_size or stat.S_IMODE(st.st_mode):
            raise JailError(f"could not conceal {p}")


def _drop_capabilities(lib: ctypes.CDLL) -> None:
    for cap in range(64):
        if lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 1:  # EPERM
            raise JailError("could not drop the capability bounding set")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    hdr = Header(0x20080522, 0)
    data = (Data * 2)()
    if lib.capset(ctypes.byref(hdr), data) != 0:
        raise JailError(f"capset failed: {os.strerror(ctypes.get_errno())}")


def set_rlimits(limits: dict[str, int]) -> None:
    table = {
        "cpu_s": resource.RLIMIT_CPU,
        "fsize_bytes": resource.RLIMIT_FSIZE,
        "nproc": resource.RLIMIT_NPROC,
        "nofile": resource.RLIMIT_NOFILE,
        "as_bytes": resource.RLIMIT_AS,
    }
    for key, value in limits.items():
        if key not in table:
            raise JailError(f"unknown rlimit {key!r}")
        if value and value > 0:
            soft, hard = resource.getrlimit(table[key])
            v = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(table[key], (v, v))


def enter(spec: JailSpec) -> None:
    """Confine the calling process (must be the first process of fresh pid/net/mount namespaces, as root).

    Raises JailError when any step fails; the caller must then exit without running untrusted code.
    """
    lib = _libc()
    ws = os.path.realpath(spec.workspace)
    _mount(lib, None, "/", None, MS_REC | MS_PRIVATE)
    keep_rw = [ws] + [os.path.realpath(w) for w in spec.writable]
    for w in keep_rw:
        _mount(lib, w, w, None, MS_BIND | MS_REC)
    for f in spec.readonly:
        f = os.path.realpath(f)
        _mount(lib, f, f, None, MS_BIND)
        _mount(lib, None, f, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    if spec.hide:
        _hide(lib, list(spec.hide), list(spec.expose) + keep_rw + list(spec.readonly))
    if spec.conceal:
        _conceal(lib, list(spec.conceal))
    if spec.uid > 0:
        _expose(lib, list(spec.expose) + keep_rw, spec.uid)
    ro_files = {os.path.realpath(f) for f in spec.readonly}
    for mp, opts in _mountpoints():
        if mp in ro_files or any(mp == w or mp.startswith(w.rstrip("/") + "/") for w in keep_rw):
            continue
        if any(mp == s or mp.startswith(s + "/") for s in _SKIP_REMOUNT):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        flags |= (MS_NOSUID if "nosuid" in opts else 0) | (MS_NODEV if "nodev" in opts else 0)
        flags |= MS_NOEXEC if "noexec" in opts else 0
        try:
            _mount(lib, None, mp, None, flags)
        except JailError:
            if mp == "/":
                raise
    # /dev/shm is a writable tmpfs shared with the host: make it read-only too.
    for mp, opts in _mountpoints():
        if mp == "/dev/shm":
            try:
                _mount(lib, None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            except JailError:
                pass
    set_rlimits(spec.rlimits)
    if spec.uid > 0:
        os.setgroups([])
        os.setresgid(spec.uid, spec.uid, spec.uid)
        os.setresuid(spec.uid, spec.uid, spec.uid)
    else:
        _drop_capabilities(lib)
    if lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise JailError("prctl(PR_SET_NO_NEW_PRIVS) failed")
    # The working directory still points into the mounts as they were; resolve it again through the new ones.
    try:
        os.chdir(os.getcwd())
    except OSError:
        os.chdir(ws)


def command_prefix() -> list[str]:
    """argv prefix that starts a command in fresh pid/net/mount namespaces (see module doc)."""
    unshare = shutil.which("unshare") or "unshare"
    return [unshare, "--pid", "--net", "--mount", "--mount-proc", "--fork", "--kill-child", "--"]


def default_expose() -> list[str]:
    """Paths a jailed Python needs: the interpreter's prefixes and sys.path entries, and this repository."""
    repo = str(Path(__file__).resolve().parent.parent)
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), repo,
             os.path.realpath(sys.executable)}
    for p in sys.path:
        if p and os.path.isdir(p):
            paths.add(os.path.realpath(p))
    return sorted(paths)


def _inside(p: str, root: str) -> bool:
    return p == root or p.startswith(root.rstrip("/") + "/")


def candidate_expose() -> list[str]:
    """`default_expose()` without the repository and the working directory (sys.path's first entry under `python -m`,
    which would bind whatever folder the trusted side was started in): of the repository only the `sandbox`
    package (what a candidate process imports) and the interpreter's own paths under it (a virtual environment kept
    in the checkout) stay; see private_roots."""
    repo = os.path.realpath(str(Path(__file__).resolve().parent.parent))
    cwd = os.path.realpath(os.getcwd())
    prefixes = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]

    def interpreter(p: str) -> bool:
        return any(_inside(p, q) for q in prefixes) or "/site-packages" in p or "/dist-packages" in p

    keep = [p for p in default_expose() if interpreter(p) or not (_inside(p, repo) or p == cwd)]
    return sorted(set(keep) | {os.path.join(repo, "sandbox")})


def private_roots(extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Folders of the trusted side a candidate's jail covers (JailSpec.hide, after DEFAULT_HIDE): the repository
    (tasks and their pristine references, tests, git history, run folders kept in the checkout), plus `extra` (the
    build cache, load_inline caches, the workspaces' root). A root that is itself a needed path (the repository as
    an installed site-packages folder) is left whole by `_hide`."""
    repo = os.path.realpath(str(Path(__file__).resolve().parent.parent))
    return [repo] + [os.path.realpath(p) for p in extra if p]


def trusted_roots(cache_dir: str, workspaces_dir: str) -> list[str]:
    """What every confined process of the sandbox hides, besides DEFAULT_HIDE: `private_roots` of the build cache
    (cache_dir), the load_inline caches beside it and the workspaces' root (other jobs' workspaces)."""
    cache = Path(cache_dir)
    return private_roots([str(cache), str(cache.parent / "sandbox-inline"), str(workspaces_dir)])


_probe_cache: dict[tuple[int, str], tuple[bool, str]] = {}


def probe(uid: int, python_check: str = "import sys") -> tuple[bool, str]:
    """Whether namespace confinement works here for `uid` (runs a jailed Python once; cached).

    Returns (ok, reason). ok is False when not root, `unshare` is missing or refused, or the jailed interpreter
    cannot start / run `python_check`.
    """
    key = (uid, python_check)
    if key in _probe_cache:
        return _probe_cache[key]
    if os.geteuid() != 0:
        res = (False, "not running as root")
    elif not shutil.which("unshare"):
        res = (False, "unshare (util-linux) not found")
    else:
        import tempfile

        d = tempfile.mkdtemp(prefix="cuda-agent-jail-probe-")
        try:
            if uid > 0:
                os.chown(d, uid, uid)
            spec = JailSpec(workspace=d, uid=uid, expose=default_expose())
            code = ("import sys, json; from sandbox.jail import JailSpec, enter; "
                    "enter(JailSpec.from_json(sys.argv[1])); " + python_check)
            env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent), HOME=d)
            p = subprocess.run(command_prefix() + [sys.executable, "-c", code, spec.to_json()], capture_output=True,
                               text=True, timeout=120, env=env, cwd=d)
            res = (p.returncode == 0, "" if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1])
        except (OSError, subprocess.TimeoutExpired) as e:
            res = (False, f"{type(e).__name__}: {e}")
        finally:
            shutil.rmtree(d, ignore_errors=True)
    _probe_cache[key] = res
    return res


def describe(mode: str, spec: JailSpec | None) -> dict[str, Any]:
    """The isolation record stored in each EvalResult."""
    if mode != "namespaces" or spec is None:
        return {"mode": "none", "namespaces": [], "readonly_root": False, "uid": os.geteuid(),
                "network": "host", "rlimits": dict(spec.rlimits) if spec else {}, "process_group_kill": True}
    return {"mode": "namespaces", "namespaces": ["pid", "net", "mount"], "readonly_root": True,
            "uid": spec.uid if spec.uid > 0 else 0, "capabilities": "none", "network": "isolated (own netns)",
            "rlimits": dict(spec.rlimits), "process_group_kill": True}


def _exec_main(argv: list[str]) -> None:
    """`python -m sandbox.jail SPEC_JSON -- CMD...`: confine, then exec CMD (used for builds)."""
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: python -m sandbox.jail SPEC_JSON -- CMD ...\n")
        sys.exit(2)
    try:
        enter(JailSpec.from_json(argv[0]))
    except JailError as e:
        sys.stderr.write(f"sandbox jail: {e}\n")
        sys.exit(125)
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    _exec_main(sys.argv[1:])
