"""Trusted defences that live inside the candidate worker's process, installed before the solution is imported.

The candidate's Python code shares a process with this code, so nothing here is a wall: the walls are the other
process (the trusted worker holds the reference, the seeds and the expected outputs; the candidate never has
them) and the operating system (sandbox.jail). What this module adds is detection of the capabilities a reward
hack needs, at a level the solution cannot switch off:

- `Monitor`: a `sys.addaudithook` hook (hooks cannot be removed once added). While candidate code is on the call
  stack (a frame whose file lies in the workspace) it records, and refuses by raising, the events a hack needs:
  frame and garbage-collector introspection (`sys._getframe`, `tb_frame`/`gi_frame`, `gc.get_objects`), `exec` /
  `compile` from candidate frames, code-object swaps (`__code__` assignment), libraries and symbols loaded through
  ctypes other than the build's own artefacts and the launcher's driver calls (and those too when anything but
  sandbox.runtime looks them up), raw memory access through ctypes (string_at, from_address, from_buffer, memmove,
  memset, cast, `_ctypes.call_function`, and foreign functions made from an integer address: every class derived
  from _ctypes.CFuncPtr judges its construction, `_install_funcptr_guard`, and `FuncPtrState` looks for classes
  that bypass it at every boundary), `/proc/*/mem` and the reference file, processes, sockets, `mmap`, new audit
  hooks and thread starts. Direct guards (the immediate caller must be the solution) see through the standard
  library and generated code, and through any other library frame whose code does not name the guarded function
  (a higher-order function calling what it was handed: `torch.utils._pytree.tree_map(torch.Tensor.numpy, x)`).
- CUDA graph replays (`torch._C._CUDAGraph.replay` and `_acceleratorGraph.replay`, wrapped): counted under torch's
  current stream, read through builtins bound before any solution code (sandbox.timing.raw_stream_reader), so the
  timing gate sees a graph replayed on another stream (`install_torch_wrappers`).
- No code of the solution's runs while the monitor is busy (judging an event, or making a wrapper's call): paths are
  resolved through builtins bound at import (`_realpath`, not os.path.realpath), an event's arguments are read as
  plain values (`_plain_str`: no method of a str or bytes subclass runs), dynamo's `set_eval_frame` is refused with
  a callback, a judgement the arguments break is a violation, and a ruled event raised with a frame of the
  solution newer than the monitor's own is refused (`Monitor._while_busy`; a finaliser of the solution's that runs
  there and opens a file is refused too).
- The kernels' foreign functions: the launcher hands each one (and the CUDA driver's cuLaunchKernel) to the monitor
  (KERNEL_EVENT), which keeps it and gives back a wrapper only a launch may call (the launch counts itself first),
  so no object of the process leads to a raw entry point a launch nobody counted could go through.
- The import hook (`install_import_hook`): an import statement in candidate code is recognised from the bytecode
  of the importing frame (`IMPORT_NAME`), not from the arguments; any other route to `__import__` with a candidate
  frame as the caller (an explicit `__import__` call, or C code running on the candidate's behalf) may only reach
  allow-listed modules or torch's own.
- `StateSnapshot`: torch's global flags (TF32, cuDNN, default dtype, matmul precision, deterministic mode, threads)
  are restored to their trusted values after every candidate call (neutralised, noted in the log), and the
  identities of torch's public callables (`torch.*`, `torch.nn.functional.*`, `torch.Tensor.*`, `torch.cuda.*`)
  are compared with the trusted snapshot: a monkeypatched torch function is a violation, and so is a new key in
  the own `__dict__` of torch.Tensor or torch.nn.Module (it would shadow a method inherited from
  `torch._C.TensorBase` or `object`, which no recorded callable covers).
- `python_threads_in_workspace`: Python threads still running candidate code after a call returned.
- `HookState`: the process-wide callbacks through which code runs later, inside the harness, with no frame of the
  solution's own making it (gc callbacks and thresholds, signal handlers and interval timers, trace / profile
  functions, torch function and dispatch mode stacks, the unraisable hook): checked, and put back, at every phase
  boundary (a change is a `hook` violation).
- `IdentitySnapshot`: identities (and code objects) of every function and class attribute of the harness's own
  modules (sandbox.*, sandbox.wire included) and of the callables of the modules it relies on (os, msgpack,
  builtins, ...), and of the trusted objects' own attributes: a replacement is `harness_tampering`.

The monitor itself is reachable from nowhere the solution can name: no class attribute and no closure of an
installed wrapper refers to it (a wrapper raises the audit event GUARD_EVENT, which the hook judges; harness code
that needs the installed monitor asks for it with FETCH_EVENT, which the hook answers only with no solution frame
on the stack). It judges events whenever a frame of the solution is on the stack, in any phase: candidate code
that runs inside the harness (a hook that slipped through, a finalizer) is judged like forward.
"""

from __future__ import annotations

import builtins
import dis
import ctypes
import gc
import itertools
import operator
import os
import re
import sys
import threading
import types
from typing import Any

_IMPORT_NAME = dis.opmap["IMPORT_NAME"]
_FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "gi_code"}
_PROC_MEM = re.compile(r"^/proc/(self|thread-self|\d+)(/task/\d+)?/(mem|pagemap|maps|smaps|environ|cmdline|fd)")
_PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "subprocess.Popen",
                   "os.kill", "os.killpg", "pty.spawn", "os.startfile"}
_NET_EVENTS = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto"}
_INTROSPECTION_EVENTS = {"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                         "sys._current_exceptions", "sys.settrace", "sys.setprofile", "sys.addaudithook",
                         "cpython._PySys_ClearAuditHooks", "sys.monitoring.register_callback"}
_CTYPES_MEMORY = {"ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr", "ctypes.dlsym/handle"}
# ctypes' foreign helpers that reach any address (their calls raise no audit event on Linux): wrapped, and their
# addresses (from which a solution could make its own) removed from ctypes and _ctypes; `from_address` and
# `from_buffer` raise "ctypes.cdata" (ruled)
_CTYPES_PRIMITIVES = (("memmove", "memory_write"), ("memset", "memory_write"), ("_cast", "memory_read"),
                      ("_string_at", "memory_read"), ("_wstring_at", "memory_read"))  # cast / string_at call these
_CTYPES_ADDRS = ("_memmove_addr", "_memset_addr", "_cast_addr", "_string_at_addr", "_wstring_at_addr")
# file-system changes: solutions write no files (the extension format's load_inline build, at import, excepted)
_FS_EVENTS = {"os.rename", "os.symlink", "os.link", "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
              "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.lchmod", "os.mkfifo", "os.mknod",
              "os.setxattr", "os.removexattr", "shutil.copyfile", "shutil.copymode", "shutil.copystat",
              "shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.chown", "shutil.make_archive",
              "shutil.unpack_archive"}
# standard-library helpers that hand their caller a frame object they got through sys._getframe (file suffix ->
# function names; None: any): inspect.currentframe / stack, traceback.walk_stack, logging.currentframe, the debuggers
# (traceback.format_stack and the like return text only, and torch calls them for its own error reports)
_FRAME_HELPERS = {"/inspect.py": {"currentframe", "stack"}, "/traceback.py": {"walk_stack"},
                  "/logging/__init__.py": {"currentframe", "<lambda>"}, "/bdb.py": None, "/pdb.py": None}
_CODE_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
GUARD_EVENT = "cuda_agent.guarded"  # sys.audit(GUARD_EVENT, kind, detail, direct): a guarded function was called
FETCH_EVENT = "cuda_agent.monitor"  # sys.audit(FETCH_EVENT, box): harness code asks for the installed monitor
CALL_EVENT = "cuda_agent.call"  # sys.audit(CALL_EVENT, args, kwargs, box): a wrapper asks for its original's call
LAUNCH_EVENT = "cuda_agent.launch"  # sys.audit(LAUNCH_EVENT, name): sandbox.runtime._count, one kernel launch
# sys.audit(KERNEL_EVENT, fn, name, box): the launcher hands a kernel's foreign function (or the driver's launch call)
# to the monitor, which keeps it and puts in box a wrapper that only the launches themselves may call
KERNEL_EVENT = "cuda_agent.kernel"
# every event a rule of Monitor._judge looks at (the hook returns at once for the others)
_RULED = frozenset({GUARD_EVENT, FETCH_EVENT, "sys._getframe", "sys._getframemodulename", "object.__getattr__",
                    "object.__setattr__", "object.__delattr__", "exec", "compile", "code.__new__", "function.__new__",
                    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.call_function",
                    "open", "mmap.__new__"}
                   | _INTROSPECTION_EVENTS | _CTYPES_MEMORY | _FS_EVENTS | _PROCESS_EVENTS | _NET_EVENTS)
# events whose rule looks first at the one frame that raised them (Monitor._judge: the caller must be the solution, or
# for sys._getframe a frame helper of the standard library, which then walks the stack): in the harness phase the
# hook judges these directly instead of walking the whole stack first (same verdicts: see Monitor._hook)
_CALLER_RULED = frozenset({"sys._getframe", "sys._getframemodulename", "object.__setattr__", "object.__delattr__",
                           "exec", "compile", "code.__new__", "function.__new__"})
DRIVER_SYMBOLS = {"cuGetErrorName", "cuLaunchKernel", "cuModuleLoad", "cuModuleGetFunction", "cuDevicePrimaryCtxRetain",
                  "cuCtxGetCurrent", "cuCtxSetCurrent", "cuFuncSetAttribute", "cuInit"}
DRIVER_LIBS = {"libcuda.so.1", "libcuda.so"}


def _plain_str(v: Any) -> str | None:
    """v as an exact str, read without calling any method v's type could override (an audit event's argument is the
    caller's object, and the monitor judges it while busy: a str or bytes subclass's __eq__, __getitem__ or decode
    would run there): str and bytes (decoded, errors replaced) and their subclasses; None for anything else."""
    t = type(v)  # never isinstance: it reads v.__class__, which v's class can make a property
    if t is str:
        return v
    if issubclass(t, str):
        return str.__str__(v)
    if issubclass(t, bytes):
        return bytes.decode(v, "utf-8", "replace")
    return None


def _plain_bytes(v: Any) -> bytes | None:
    """v as exact bytes when it is bytes or a bytes subclass (read as _plain_str reads), else None."""
    return bytes.__getitem__(v, slice(None)) if issubclass(type(v), bytes) else None


def _qualname(obj: Any) -> str:
    """A function's __qualname__, read through the function type's own descriptor; "?" for anything else (an
    attribute read on an object of the solution's could run its code)."""
    return _FUNC_QUALNAME.__get__(obj) if type(obj) is types.FunctionType else "?"


_POSIX_OPEN, _POSIX_CLOSE, _POSIX_READLINK, _POSIX_GETCWD = os.open, os.close, os.readlink, os.getcwd
_NORMPATH = getattr(__import__("posix"), "_path_normpath", None) or os.path.normpath  # C on CPython 3.11+
_FUNC_QUALNAME = types.FunctionType.__dict__["__qualname__"]
_O_PATH = getattr(os, "O_PATH", 0) | os.O_CLOEXEC


def _realpath(path: str, raw: bytes | None = None) -> str:
    """The resolved absolute path of an existing `path` (an exact str), read back from /proc/self/fd after an O_PATH
    open: builtins bound at import only, so nothing a solution rebinds (os.path.realpath, posixpath's helpers,
    os.lstat) runs while the monitor judges. A path that cannot be opened is only made absolute (nothing exists
    there to read) and normalised (a `..` climbs out lexically, as os.path.realpath's would); "" when /proc cannot
    be read or the working directory is gone. raw: the bytes the caller opens, when it opens bytes (decoding them
    could name another file)."""
    try:
        fd = _POSIX_OPEN(raw if raw is not None else path, _O_PATH)
    except OSError:
        try:
            return _NORMPATH(path if path.startswith("/") else _POSIX_GETCWD() + "/" + path)
        except OSError:
            return ""
    try:
        return _POSIX_READLINK(f"/proc/self/fd/{fd}")
    except OSError:
        return ""  # no /proc to read it back from: matches no allowed root (a read there by the solution is refused)
    finally:
        _POSIX_CLOSE(fd)


def _stdlib_prefixes() -> tuple[str, ...]:
    import sysconfig

    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")}
    return tuple(os.path.realpath(p).rstrip("/") + "/" for p in paths if p)


_STDLIB = _stdlib_prefixes()


def _forwarding_glue(filename: str) -> bool:
    """Generated code ("<string>", "<lambda>"...) or the standard library (not its site-packages): frames that only
    pass a call on, for the attribution of direct calls (Monitor._acting_for_candidate)."""
    if filename.startswith("<"):
        return True
    return filename.startswith(_STDLIB) and "/site-packages/" not in filename and "/dist-packages/" not in filename


def _launch_codes() -> tuple[Any, set[int]]:
    """(code of sandbox.runtime._count, ids of the code objects of the launches that call it)."""
    from sandbox import runtime

    codes = {id(f.__code__) for f in (runtime.CpuKernel.__call__, runtime.CubinKernel.__call__)}
    return runtime._count.__code__, codes


def _cpu_init_code() -> Any:
    from sandbox import runtime

    return runtime.CpuKernel.__init__.__code__


def _cpu_launch_code() -> Any:
    """Code of sandbox.runtime.CpuKernel.__call__, whose launches the monitor counts at the foreign call itself."""
    from sandbox import runtime

    return runtime.CpuKernel.__call__.__code__


def _runtime_codes() -> tuple[Any, dict[int, Any], dict[int, Any]]:
    """(code of sandbox.runtime._guarded, which raises KERNEL_EVENT, {id: code} of its callers, the launcher's
    registrations of foreign functions (CpuKernel.__init__, _Driver.__init__), {id: code} of every function of
    sandbox.runtime: the launcher, which alone looks up the build's symbols)."""
    from sandbox import runtime

    reg = {id(f.__code__): f.__code__ for f in (runtime.CpuKernel.__init__, runtime._Driver.__init__)}
    every: dict[int, Any] = {}
    for v in list(vars(runtime).values()):
        for f in ([v] + list(vars(v).values()) if isinstance(v, type) and v.__module__ == runtime.__name__ else [v]):
            code = getattr(f, "__code__", None)
            if isinstance(code, types.CodeType) and code.co_filename == runtime.__file__:
                every[id(code)] = code
    return runtime._guarded.__code__, reg, every


_CTYPES_DIR = os.path.dirname(os.path.realpath(__import__("ctypes").__file__)) + "/"


def _trusted_exec_callers() -> dict[int, Any]:
    """{id(code): code} of the standard library's functions that exec / eval source they generate from validated
    identifiers (collections.namedtuple; dataclasses' method builders): their exec is not the solution's."""
    import collections
    import dataclasses

    fns = [collections.namedtuple, getattr(dataclasses, "_create_fn", None)]
    builder = getattr(dataclasses, "_FuncBuilder", None)  # Python 3.13
    if builder is not None:
        fns.append(getattr(builder, "add_fns_to_class", None))
    codes = [getattr(f, "__code__", None) for f in fns if f is not None]
    return {id(c): c for c in codes if c is not None}


class IntegrityError(ImportError):
    """Raised into candidate code when it uses a capability a reward hack needs (the record is kept)."""


class Monitor:
    """The audit hook (see module doc). One per process: `Monitor.install(...)`; read `violations`."""

    def __init__(self, workspace: str, fmt: str, allowed_libs: set[str], allowed_symbols: set[str]):
        self.ws = os.path.realpath(workspace).rstrip("/") + "/"
        self.fmt = fmt
        self.allowed_libs = {os.path.realpath(p) if "/" in p else p for p in allowed_libs} | DRIVER_LIBS
        self.allowed_symbols = set(allowed_symbols) | DRIVER_SYMBOLS
        self.violations: list[tuple[str, str]] = []
        # wrapper code object -> (original, kind, detail, direct): the originals of the guarded functions live here
        # only (a wrapper holds none: see _wrap), so no closure or attribute of a wrapper leads to them
        self._originals: dict[int, tuple[Any, Any, str | None, str, bool]] = {}
        self._module_codes: dict[tuple, Any] = {}  # (path, size, mtime) -> the module code its source compiles to
        self._exec_callers = _trusted_exec_callers()
        self.launches: dict[str, int] = {}  # kernel name -> launches, counted from LAUNCH_EVENT (see _count_launch)
        self.launch_streams: dict[int, int] = {}  # CUstream handle -> launches (cubin), from the same events, and
        # CUDA graph replays (count_graph_replays; the stream read through _stream_handle, bound there)
        self._stream_handle: Any = None
        self._count_code, self._launch_codes = _launch_codes()
        self._guarded_code, self._register_codes, self._runtime_codes = _runtime_codes()
        self._cpu_launch = _cpu_launch_code()
        self._cpu_init = _cpu_init_code()
        self._kernel_names: dict[int, str] = {}  # wrapper code id -> cpu kernel name (counted where it is called)
        self.phase = "harness"  # "load" (import + construction) or "call" (forward) while candidate code runs
        self._busy = False
        self._inner = False  # _while_busy is looking at a frame
        self._getframe = sys._getframe
        self._reference = os.path.join(self.ws, "model.py")
        self.allowed_files = {os.path.realpath(p) for p in allowed_libs if "/" in p}
        manifest = os.environ.get("CUDA_AGENT_KERNELS_MANIFEST")
        if manifest:
            self.allowed_files.add(os.path.realpath(manifest))
        dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
        dirs |= {os.path.realpath(p) for p in sys.path if p and "site-packages" in p}
        dirs |= {os.path.dirname(os.path.realpath(__file__)), "/usr/lib", "/usr/lib64", "/lib", "/lib64",
                 "/usr/local/cuda", "/sys/devices/system/cpu", "/dev/shm", "/etc/ld.so.cache.d"}
        self.read_roots = tuple(d.rstrip("/") + "/" for d in dirs) + (
            "/etc/ld.so.cache", "/proc/self/status", "/proc/cpuinfo", "/dev/null", "/dev/urandom")

    @classmethod
    def installed(cls) -> "Monitor | None":
        """The monitor installed in this process, if any (asked through the hook itself: see module doc)."""
        box: list = []
        sys.audit(FETCH_EVENT, box)
        return box[0] if box else None

    @classmethod
    def install(cls, workspace: str, fmt: str, allowed_libs: set[str], allowed_symbols: set[str]) -> "Monitor":
        m = cls.installed()
        if m is not None:
            m.allowed_libs |= {os.path.realpath(p) if "/" in p else p for p in allowed_libs}
            m.allowed_symbols |= set(allowed_symbols)
            return m
        m = cls(workspace, fmt, allowed_libs, allowed_symbols)
        m._installed = True  # the one FETCH_EVENT answers with
        sys.addaudithook(m._hook)
        return m

    def config(self) -> tuple:
        """What the monitor judges by (compared with a trusted copy at every boundary)."""
        return (self.ws, self.fmt, frozenset(self.allowed_libs), frozenset(self.allowed_symbols),
                frozenset(self.allowed_files), self.read_roots, self._reference, self._getframe,
                frozenset((k, id(o[1])) for k, o in self._originals.items() if o[2] != "launch"))

    # -------------------------------------------------------------------- attribution
    def _is_candidate(self, code: Any) -> bool:
        fn = code.co_filename
        return fn.startswith(self.ws) and not fn.endswith("/model.py")

    def _candidate_on_stack(self, depth: int) -> bool:
        return self._candidate_from(self._getframe(depth))

    def _candidate_from(self, f: Any) -> bool:
        """Whether frame f or one of its callers (f_back, which is not audited) runs the solution's code."""
        while f is not None:
            if self._is_candidate(f.f_code):
                return True
            f = f.f_back
        return False

    def _caller_is_candidate(self, depth: int) -> bool:
        f = self._getframe(depth)
        return f is not None and self._is_candidate(f.f_code)

    def _acting_for_candidate(self, f: Any, name: str | None = None) -> bool:
        """Whether frame f is the solution's, or forwards for it: frames of generated code ("<string>": dataclass
        __init__, namedtuple) and of the standard library (functools.singledispatch, ...) between f and the first
        other frame are skipped, so a guarded call the solution routes through them counts as its own (the
        attribution of direct guards). name (the guarded function's name, for the wrappers of _wrap): that first
        other frame (torch, say) uses the guarded function itself only if its code names it (co_names: the global
        or attribute it calls, as torch's dispatch machinery does with _pop_mode_temporarily); one that does not
        called a callable it was handed (torch.utils._pytree.tree_map(torch.Tensor.numpy, x), Module.apply, vmap,
        ...): the call is then the solution's when a frame of the solution is further up the stack."""
        while f is not None:
            code = f.f_code
            if self._is_candidate(code):
                return True
            if not _forwarding_glue(code.co_filename):
                if name is None or name in code.co_names:
                    return False
                return self._candidate_from(f.f_back)
            f = f.f_back
        return False

    def record(self, kind: str, detail: str) -> None:
        self.violations.append((kind, detail))

    # -------------------------------------------------------------------- the hook
    def _hook(self, event: str, args: tuple) -> None:
        """The audit hook. CALL_EVENT first (a wrapper's call of its original), then cheap filters (set lookups):
        most events (attribute reads such as __code__, id(), imports) have no rule here; then GUARD_EVENT /
        FETCH_EVENT; then, in the harness phase, events whose rule needs a frame of the solution somewhere on the
        stack are dropped when none is there (one walk of the stack, ~1 us per frame: every f_code read is itself an
        audited event). Every verdict of `_judge` requires a frame of the solution on the stack (its own caller, or
        one found by `_candidate_on_stack`), so judging an event directly gives the verdict the walk-first order
        gives: the events of `_CALLER_RULED`, whose rules look at the raising frame before anything else (the import
        hook's own sys._getframe, every import), skip the walk.
        """
        if type(event) is not str:  # sys.audit takes a str subclass too: its methods would run below
            event = _plain_str(event) or ""
        if event == CALL_EVENT:
            self._call_original(args)
            return
        if event == LAUNCH_EVENT:
            self._count_launch(args)
            return
        if event == KERNEL_EVENT:
            self._take_kernel(args)
            return
        if event not in _RULED:
            return
        if event == "object.__getattr__" and (len(args) < 2 or args[1] not in _FRAME_ATTRS):
            return
        if event in ("object.__setattr__", "object.__delattr__") and (len(args) < 2 or args[1] not in _CODE_ATTRS):
            return
        if self._busy:
            # f_back reads are the monitor's own stack walks: without a first frame (every way to one is a ruled
            # event, judged here too) the solution has none to walk from
            if not (event == "object.__getattr__" and _plain_str(args[1]) == "f_back"):
                self._while_busy(event)
            return
        self._busy = True
        try:
            if event == FETCH_EVENT:
                verdict = self._fetch(args)
            elif event == GUARD_EVENT:
                verdict = self._judge(event, args)
            elif self.phase == "harness" and event not in _CALLER_RULED and not self._candidate_on_stack(2):
                verdict = None  # harness code only
            else:
                verdict = self._judge(event, args)
        except IntegrityError:
            raise
        except BaseException:  # noqa: BLE001 - SystemExit from the solution's object too
            # the solution's objects in the event's arguments can make a judgement fail: with the solution on the
            # stack that is a violation, not an event let through
            self._busy = False
            if not self._candidate_on_stack(2):
                raise
            verdict = ("harness_tampering", f"the sandbox's monitor could not judge {event} (its arguments broke it)")
        finally:
            self._busy = False
        if verdict is not None:
            self.record(*verdict)
            raise IntegrityError(f"{verdict[1]} (forbidden in a solution)")

    def _while_busy(self, event: str) -> None:
        """A ruled event raised while the monitor judges or makes a call (busy): its own work and the library code it
        calls pass unjudged, but not code of the solution's that ran there because the solution rebound something
        the monitor calls (os.path.realpath's helpers, a str subclass's __eq__ in a set lookup, a torch._C
        function): from inside the busy window, gc or a frame would lead it to the monitor and the originals it
        keeps. Refused (harness_tampering) when a frame of the solution lies between the frame that raised the event
        and the monitor's own newest frame (library frames the solution called in between, torch's or the standard
        library's, do not hide it)."""
        if self._inner:
            return  # this check's own sys._getframe
        self._inner = True
        hit = False
        try:
            f = self._getframe(2)  # 0 this, 1 _hook, 2 the frame that raised the event
            while f is not None:
                code = f.f_code
                if id(code) in _MONITOR_CODES:  # the monitor's own frame: nothing of the solution's ran since
                    break
                if self._is_candidate(code):
                    hit = True
                    break
                f = f.f_back
        finally:
            self._inner = False
        if hit:
            detail = f"{event} raised by the solution's code while the sandbox's monitor was busy (a function it calls "
            detail += "was rebound to the solution's)"
            self.record("harness_tampering", detail)
            raise IntegrityError(f"{detail} (forbidden in a solution)")

    def _event_frame(self) -> Any:
        """The frame that raised the audit event being handled, for the handlers `_hook` calls directly
        (_call_original, _count_launch, _take_kernel): seen from here, 0 this, 1 the handler, 2 _hook, 3 that frame."""
        return self._getframe(3)

    def _count_launch(self, args: tuple) -> None:
        """LAUNCH_EVENT: counted only when raised by sandbox.runtime._count called from a kernel's launch (code
        identity); from anywhere else it is a forged launch (the solution calling _count, or raising the event)."""
        busy, self._busy = self._busy, True
        try:
            f = self._event_frame()
            code = f.f_code if f is not None else None
            caller = f.f_back if f is not None else None
            launcher = caller.f_code if caller is not None else None
            ok = code is not None and code is self._count_code and launcher is not None \
                and id(launcher) in self._launch_codes
        finally:
            self._busy = busy
        if ok and launcher is self._cpu_launch and self._kernel_names:
            return  # a cpu kernel's launch is counted where its foreign function is called (_call_original)
        if not ok:
            self.record("harness_tampering", "a kernel launch was counted without a launch (the solution raised the "
                                             "sandbox's launch event or called its counter)")
            raise IntegrityError("a launch counted without a launch (forbidden in a solution)")
        name = str(args[0]) if args else "?"
        self.launches[name] = self.launches.get(name, 0) + 1
        stream = args[1] if len(args) > 1 and type(args[1]) is int else 0
        self.launch_streams[stream] = self.launch_streams.get(stream, 0) + 1

    def register(self, wrapper: Any, orig: Any, kind: str | None, detail: str, direct: bool) -> None:
        """Keep `orig` for the wrapper function (its own code object: see _wrap); kind None: no verdict here."""
        code = wrapper.__code__  # keyed by identity (code objects compare by value), kept alive in the entry
        self._originals[id(code)] = (code, orig, kind, detail, direct)

    def _call_original(self, args: tuple) -> None:
        """CALL_EVENT (args, kwargs, box) from a wrapper: judge the call as GUARD_EVENT does, then call the original
        (outside the busy state: what it runs is judged as usual) and put its result in box. The original is chosen
        by the code object of the frame that raised the event, so a solution that raises the event itself, or
        swaps a wrapper's closure cells, reaches nothing."""
        busy, self._busy = self._busy, True  # (already busy: a wrapper called from another thread mid-judgement)
        try:
            f = self._event_frame()
            code = f.f_code if f is not None else None  # read once: every f_code read is an audited event
            entry = self._originals.get(id(code)) if code is not None else None
            if entry is None or entry[0] is not code:
                entry, verdict = None, ("harness_tampering", "the sandbox's call event was raised outside its wrappers")
            elif entry[2] is None:
                verdict = None
            elif entry[2] == "eval_frame":  # torch's own callers pass None, False or True (dynamo's disable)
                cb = args[0][0] if args and args[0] else None
                plain = cb is None or cb is False or cb is True
                verdict = None if plain or not self._candidate_from(f.f_back) else (
                    "guard_bypass", "set_eval_frame with a callback while the solution is on the stack (every Python "
                                    "frame evaluated later would be handed to it)")
            elif entry[2] == "graph_replay":  # counted on its stream, as a launch is (the timing gate's side-work rule)
                verdict = None
                stream = self._stream_handle()
                self.launch_streams[stream] = self.launch_streams.get(stream, 0) + 1
            elif entry[2] == "launch":  # a kernel's foreign function: only its launcher calls it
                caller = f.f_back
                ok = caller is not None and id(caller.f_code) in self._launch_codes
                verdict = None if ok else ("harness_tampering", f"{entry[3]}: its raw entry point was called outside "
                                                                "the launcher (an uncounted launch)")
                name = self._kernel_names.get(id(code)) if ok else None
                if name is not None:  # counted here, at the kernel's own call (whatever the launcher object holds)
                    self.launches[name] = self.launches.get(name, 0) + 1
            else:  # the wrapper's caller is f.f_back: the frame _guard_verdict would look up (no second getframe)
                verdict = self._guard_verdict(entry[2], entry[3], entry[4], f.f_back, code.co_name)
        finally:
            self._busy = busy
        if verdict is not None:
            self.record(*verdict)
            raise IntegrityError(f"{verdict[1]} (forbidden in a solution)")
        a, k, box = args
        box.append(entry[1](*a, **k))

    def _take_kernel(self, args: tuple) -> None:
        """KERNEL_EVENT (fn, name, box): keep a foreign function of the launcher (a kernel's entry point, the
        driver's launch call) and put in box the wrapper the launcher calls instead, so no object the solution can
        reach holds the raw function (a call of it would be a launch nobody counted). Taken only from the
        launcher's own registrations (code identity); from anywhere else it is harness_tampering."""
        busy, self._busy = self._busy, True  # busy while the wrapper is made too (a code object of its own)
        try:
            f = self._event_frame()  # sandbox.runtime._guarded, called by the launcher's registration
            code = f.f_code if f is not None else None
            caller = f.f_back if code is self._guarded_code else None
            reg = caller.f_code if caller is not None else None
            ok = (reg is not None and self._register_codes.get(id(reg)) is reg and len(args) == 3
                  and type(args[2]) is list)
            if ok:
                w = _wrap(self, args[0], "launch", f"kernel {args[1]}")
                if reg is self._cpu_init:
                    self._kernel_names[id(w.__code__)] = str(args[1])
                args[2].append(w)
        finally:
            self._busy = busy
        if not ok:
            self.record("harness_tampering", "the sandbox's kernel registration event was raised outside the launcher")
            raise IntegrityError("a kernel registered outside the launcher (forbidden in a solution)")

    def _guard_verdict(self, kind: str, detail: str, direct: bool, caller: Any = False,
                       name: str | None = None) -> tuple[str, str] | None:
        """caller: the guarded function's caller frame when the caller of this already has it (False: looked up
        here, seen from the helpers: 0 helper, 1 this, 2 _judge or _call_original, 3 _hook, 4 the wrapper, 5 its
        caller). name: the guarded function's (see _acting_for_candidate)."""
        if kind == "thread" and self.fmt == "extension" and self.phase == "load":
            return None  # load_inline's build starts threads (ninja, compilers; confined by the jail)
        if caller is False:
            # seen from here: 0 this, 1 _judge or _call_original, 2 _hook, 3 the wrapper, 4 its caller
            hit = self._acting_for_candidate(self._getframe(4)) if direct else self._candidate_on_stack(5)
        else:
            hit = self._acting_for_candidate(caller, name) if direct else self._candidate_from(caller)
        if hit:
            return (str(kind), str(detail))
        return None

    def _harness_frame(self, f: Any) -> bool:
        """Whether frame f lies below every frame of the solution on the current stack (a frame of the harness that
        called it) while one is on the stack: no solution frame at f or older than f, one newer."""
        if self._candidate_from(f):
            return False  # f is the solution's, or something it called
        return self._candidate_on_stack(4)  # seen from here: 0 helper, 1 this, 2 _judge, 3 _hook, 4 the asker

    def _launcher_lookup(self) -> bool:
        """Whether the frame that looks up a symbol (the first one outside the ctypes package, whose CDLL.__getattr__ /
        __getitem__ raise ctypes.dlsym) is a function of sandbox.runtime (code identity)."""
        f = self._getframe(3)  # seen from here: 0 this, 1 _judge, 2 _hook, 3 the frame that called the C function
        glue = getattr(self, "_funcptr_new", None)  # the function-pointer guard's __new__ (install_ctypes_guards)
        while f is not None:
            code = f.f_code
            if code is not glue and not code.co_filename.startswith(_CTYPES_DIR):
                return self._runtime_codes.get(id(code)) is code
            f = f.f_back
        return False

    def _lenient_load(self) -> bool:
        """The extension format's load: load_inline builds and imports its module (setuptools and the like do
        what the stack rules refuse: exec of generated source, __defaults__ writes)."""
        return self.fmt == "extension" and self.phase == "load"

    def _trusted_exec_caller(self) -> bool:
        """Whether the frame that called exec / eval is one of the standard library's code generators whose
        generated source the solution cannot choose (namedtuple, dataclasses): by code object identity."""
        f = self._getframe(3)  # seen from here: 0 this, 1 _judge, 2 _hook, 3 the frame that called exec / eval
        return f is not None and id(f.f_code) in self._exec_callers and self._exec_callers[id(f.f_code)] is f.f_code

    def _genuine_module_code(self, code: Any) -> bool:
        """Whether `code` is the module code of a file outside the workspace, compiled from that file's source (what
        an import executes). Verified files are remembered by (path, size, mtime)."""
        if type(code) is not types.CodeType or code.co_name != "<module>":
            return False
        path = code.co_filename
        if not path or path.startswith(self.ws) or not path.endswith(".py"):
            return False
        try:
            st = os.stat(path)
            key = (path, st.st_size, st.st_mtime_ns)
            ref = self._module_codes.get(key)
            if ref is None:
                with open(path, "rb") as f:
                    ref = compile(f.read(), path, "exec", dont_inherit=True)
                self._module_codes[key] = ref
        except (OSError, SyntaxError, ValueError):
            return False
        return ref == code

    def _fetch(self, args: tuple) -> tuple[str, str] | None:
        # seen from here: 0 _fetch... helpers: 0 helper, 1 _fetch, 2 _hook, 3 the frame calling sys.audit
        if self._candidate_on_stack(3):
            return ("introspection", "the solution asked for the sandbox's monitor")
        if getattr(self, "_installed", False) and args and type(args[0]) is list:
            args[0].append(self)
        return None

    def _judge(self, event: str, args: tuple) -> tuple[str, str] | None:  # noqa: C901 - one table of rules
        # seen from the helpers: 0 helper, 1 _judge, 2 _hook, 3 the Python frame that called the C function raising the event
        if event == GUARD_EVENT:  # (kind, detail, direct): a guarded function's wrapper (frame 3) was called
            kind, detail, direct = (tuple(args) + ("", "", False))[:3]
            # the arguments may be the solution's own objects (it can raise the event itself): read as plain values
            return self._guard_verdict(_plain_str(kind) or "guard", _plain_str(detail) or "", direct is True)
        if event in ("sys._getframe", "sys._getframemodulename"):
            f = self._getframe(2)  # seen from here: 0 _judge, 1 _hook, 2 the frame that called sys._getframe
            if f is None:
                return None
            code = f.f_code  # read once (each read of f_code is an audited event of its own)
            if self._is_candidate(code):
                return ("introspection", "sys._getframe called by the solution (call-stack inspection)")
            fn = code.co_filename
            helper = next((names for suffix, names in _FRAME_HELPERS.items() if fn.endswith(suffix)), False)
            if (helper is None or (helper and code.co_name in helper)) and self._candidate_on_stack(3):
                return ("introspection", f"sys._getframe called for the solution by {os.path.basename(fn)}"
                                         " (call-stack inspection)")
            # whoever asks (functools.singledispatch(sys._getframe) makes functools the caller): while the solution
            # runs, no frame older than its outermost one (the harness's) is handed out
            if (event == "sys._getframe" and self.phase != "harness" and args and type(args[0]) is types.FrameType
                    and self._harness_frame(args[0])):
                return ("introspection", f"sys._getframe would hand out a frame of the harness "
                                         f"({os.path.basename(fn)} asked, with the solution on the stack)")
            return None
        if event == "object.__getattr__":
            name = _plain_str(args[1]) if len(args) > 1 else ""
            if name in _FRAME_ATTRS and self._candidate_on_stack(3):
                return ("introspection", f"access to .{name} by the solution (frame inspection)")
            return None
        if event in ("object.__setattr__", "object.__delattr__"):
            obj = args[0] if args else None
            name = _plain_str(args[1]) if len(args) > 1 else ""
            # only when the solution's own frame does the write: stdlib code the solution merely imports
            # (collections.namedtuple sets __new__.__defaults__, e.g. under setuptools during load_inline) is not it
            if name in _CODE_ATTRS and self._caller_is_candidate(3):
                return ("tampering", f"the solution replaced {name} of {_qualname(obj)}")
            # a new __code__ can carry any co_filename (the attribution of every rule here): refused whoever does
            # the write while the solution is on the stack (functools.update_wrapper would do it for it)
            if name == "__code__" and not self._lenient_load() and self._candidate_on_stack(3):
                return ("dynamic_code", f"__code__ of {_qualname(obj)} replaced while the "
                                        "solution is on the stack")
            return None
        if event in ("exec", "compile"):
            if self._caller_is_candidate(3):
                return ("dynamic_code", f"{event}() called by the solution")
            # exec through a library frame (functools.singledispatch(exec), ...) would run code whose co_filename the
            # solution chose; with the solution on the stack only an import's module code passes (the code the
            # file's own source compiles to)
            if (event == "exec" and not self._lenient_load() and not self._trusted_exec_caller()
                    and self._candidate_on_stack(3) and not self._genuine_module_code(args[0] if args else None)):
                return ("dynamic_code", "exec of code that is not a module's own source, while the solution is on "
                                        "the stack")
            return None
        if event == "code.__new__" or event == "function.__new__":
            # a new code object (code.replace) or function can carry any co_filename: whoever makes it
            if self._caller_is_candidate(3) or (not self._lenient_load() and self._candidate_on_stack(3)):
                return ("dynamic_code", f"{event} while the solution is on the stack")
            return None
        if event in _INTROSPECTION_EVENTS:
            if self._candidate_on_stack(3):
                return ("introspection", f"{event} called by the solution")
            return None
        if event == "ctypes.dlopen":
            name = _plain_str(args[0]) if args else None
            key = name
            if key is not None and "/" in key:
                key = _realpath(key)
            if key not in self.allowed_libs and self._candidate_on_stack(3):
                return ("ctypes", f"the solution loaded the library {name!r} through ctypes (only the build's own "
                                  "kernels may be loaded, through sandbox.runtime)")
            return None
        if event == "ctypes.dlsym":
            name = _plain_str(args[1]) if len(args) > 1 else None
            if name is not None and name not in self.allowed_symbols and self._candidate_on_stack(3):
                return ("ctypes", f"the solution looked up the symbol {name!r} through ctypes")
            # the build's own symbols and the driver's too, but only for the launcher: a foreign function of the
            # solution's own making would launch a kernel nobody counts
            if not self._lenient_load() and not self._launcher_lookup() and self._candidate_on_stack(3):
                return ("ctypes", f"the solution looked up the symbol {name!r} through ctypes itself (kernels are "
                                  "launched through sandbox.runtime)")
            return None
        if event in ("ctypes.cdata", "ctypes.cdata/buffer"):
            if self._candidate_on_stack(3):
                how = "from_address" if event == "ctypes.cdata" else "from_buffer"
                return ("memory_read", f"a ctypes object made from a raw address ({how}) by the solution "
                                       "(raw access to process memory)")
            return None
        if event == "ctypes.call_function":
            if self._candidate_on_stack(3):
                return ("memory_read", "_ctypes.call_function of a raw address by the solution (it calls whatever "
                                       "lies there)")
            return None
        if event in _CTYPES_MEMORY:
            if self._candidate_on_stack(3):
                return ("memory_read", f"{event} called by the solution (reading process memory)")
            return None
        if self.fmt == "extension" and self.phase == "load" and (
                event in ("open", "ctypes.dlopen", "ctypes.dlsym", "subprocess.Popen", "os.posix_spawn")
                or event in _FS_EVENTS):
            return None  # load_inline builds and loads its module at import (ninja, compilers; confined by the jail)
        if event == "open":
            path = _plain_str(args[0]) if args else ""
            if path is None:
                return None
            raw = _plain_bytes(args[0]) if args else None
            if _PROC_MEM.match(path) or path.startswith("/dev/mem"):
                if self._candidate_on_stack(3):
                    return ("memory_read", f"the solution opened {path}")
                return None
            real = _realpath(path, raw) if path else path
            if real == self._reference and self._candidate_on_stack(3):
                return ("reference_access", "the solution opened the reference model.py")
            mode = _plain_str(args[1]) if len(args) > 1 else "r"
            flags = int.__index__(args[2]) if len(args) > 2 and isinstance(args[2], int) else 0
            writing = (mode is not None and any(c in mode for c in "wax+")) or bool(flags & (os.O_WRONLY | os.O_RDWR))
            if writing:
                if self._candidate_on_stack(3):
                    return ("file_write", f"the solution opened {path} for writing (solutions write no files)")
                return None
            if real.startswith(self.ws) or real in self.allowed_files or real.startswith(self.read_roots):
                return None
            if self._candidate_on_stack(3):
                return ("file_access", f"the solution opened {path} (outside its workspace and the Python installation)")
            return None
        if event in _FS_EVENTS:
            if self._candidate_on_stack(3):
                what = _plain_str(args[0]) if args else ""
                return ("file_write", f"{event}({what!r}) by the solution (solutions change no files)")
            return None
        if event in _PROCESS_EVENTS:
            if self._candidate_on_stack(3):
                return ("process", f"{event} by the solution")
            return None
        if event in _NET_EVENTS:
            if self._candidate_on_stack(3):
                return ("network", f"{event} by the solution")
            return None
        if event == "mmap.__new__":
            if self._candidate_on_stack(3):
                return ("process", "mmap by the solution (shared memory)")
            return None
        return None


# the code objects of the monitor's own methods (Monitor._while_busy's walk stops at the newest of them; other
# functions of this module are within the solution's reach and prove nothing)
_MONITOR_CODES = frozenset(id(f.__code__) for f in vars(Monitor).values() if isinstance(f, types.FunctionType))


# ------------------------------------------------------------------------------------------------ imports
def install_import_hook(allowed: set[str], monitor: Monitor) -> None:
    """Replace builtins.__import__ once (see module doc). Violations are kind "import": raised as GUARD_EVENT for the
    installed monitor (the replacement holds no reference to it, nor, then, to the original __import__, which the
    monitor keeps and calls: see _wrap), recorded on `monitor` directly when it is not installed (runtime_monitor
    off)."""
    if getattr(builtins.__import__, "_cuda_agent_guard", False):
        return
    getframe = sys._getframe
    audit = sys.audit
    is_candidate = _candidate_test(monitor.ws)
    installed = Monitor.installed() is monitor
    record = None if installed else monitor.record

    def refused(name: str, fromlist: Any, level: int) -> str | None:
        f = getframe(2)
        if f is None:
            return None
        code = f.f_code
        if not is_candidate(code):
            # (the standard library imports for its callers, e.g. encodings.search_function's __import__ call: an
            # import routed through it is not judged here; what the solution could compute with a module it reaches
            # is refused at the bridges and the dispatch guard)
            return None
        statement = code.co_code[f.f_lasti] == _IMPORT_NAME if f.f_lasti >= 0 else False
        if statement:
            bad = level != 0 or name not in allowed
            if not bad and name == "sandbox":
                bad = any(x != "runtime" for x in (fromlist or ()))
        else:
            root = name.split(".")[0]
            bad = level != 0 or not (name in allowed or root == "torch")
        if not bad:
            return None
        how = "imports" if statement else "reaches __import__ for"
        msg = f"model_new.py {how} {'.' * level}{name} (not on the allow-list)"
        if record is not None:
            record("import", msg)
        else:
            audit(GUARD_EVENT, "import", msg, False)
        return msg

    if installed:
        def guarded(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
            msg = refused(name, fromlist, level)
            if msg is not None:
                raise ImportError(msg)
            box: list = []
            audit(CALL_EVENT, (name, globals, locals, fromlist, level), {}, box)
            return box[0]

        monitor.register(guarded, builtins.__import__, None, "", False)
    else:
        orig = builtins.__import__

        def guarded(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
            msg = refused(name, fromlist, level)
            if msg is not None:
                raise ImportError(msg)
            return orig(name, globals, locals, fromlist, level)

    guarded._cuda_agent_guard = True  # type: ignore[attr-defined]
    builtins.__import__ = guarded


def _candidate_test(ws: str) -> Any:
    """Monitor._is_candidate for a fixed workspace prefix, without a reference to the monitor."""

    def is_candidate(code: Any) -> bool:
        fn = code.co_filename
        return fn.startswith(ws) and not fn.endswith("/model.py")

    return is_candidate


# ------------------------------------------------------------------------------------------------ threads
def install_thread_guard(monitor: Monitor) -> None:
    """Refuse new Python threads started from candidate code (threading.Thread.start and _thread.start_new_thread
    both end in the replaced start function; GUARD_EVENT, judged by the installed monitor in every phase but the
    extension format's load)."""
    import _thread

    orig = _thread.start_new_thread
    if getattr(orig, "_cuda_agent_guard", False):
        return
    start_new_thread = _wrap(monitor, orig, "thread", "the solution started a thread (work must finish inside forward, on "
                                             "the device's streams)", direct=False)
    _thread.start_new_thread = start_new_thread
    _thread.start_new = start_new_thread
    threading._start_new_thread = start_new_thread  # type: ignore[attr-defined]


def python_threads_in_workspace(monitor: Monitor) -> list[str]:
    """Python threads other than the calling one that are executing candidate code right now."""
    me = threading.get_ident()
    out = []
    prev, monitor.phase = monitor.phase, "harness"
    try:
        frames = sys._current_frames()
    finally:
        monitor.phase = prev
    # this thread's entry is this very frame: kept in a local, it made a reference cycle (frame -> frames -> frame)
    # that held the callers' frames and their locals (the candidate's `sample` with a repetition's outputs) until
    # the cyclic collector ran. Each timed call then got fresh heap pages (16 MiB of page faults a call for
    # elementwise_chain x4 on the CPU box: 7-40x slower repetitions, rewards lost)
    frames.pop(me, None)
    try:
        for tid, f in frames.items():
            while f is not None:
                if monitor._is_candidate(f.f_code):
                    out.append(f"thread {tid} runs {os.path.basename(f.f_code.co_filename)}:{f.f_lineno} after "
                               "forward returned")
                    break
                f = f.f_back
    finally:
        frames.clear()
    return out


# ------------------------------------------------------------------------------------------------ torch state
def _torch_flags() -> dict[str, tuple[Any, Any]]:
    """name -> (getter, setter) of torch's global numerics flags."""
    import torch

    b = torch.backends
    flags: dict[str, tuple[Any, Any]] = {
        "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "num_threads": (torch.get_num_threads, torch.set_num_threads),
        "deterministic_algorithms": (torch.are_deterministic_algorithms_enabled,
                                     lambda v: torch.use_deterministic_algorithms(v)),
        "grad_enabled": (torch.is_grad_enabled, torch.set_grad_enabled),
        "cuda.matmul.allow_tf32": (lambda: b.cuda.matmul.allow_tf32, lambda v: setattr(b.cuda.matmul, "allow_tf32", v)),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": (
            lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction,
            lambda v: setattr(b.cuda.matmul, "allow_fp16_reduced_precision_reduction", v)),
        "cudnn.allow_tf32": (lambda: b.cudnn.allow_tf32, lambda v: setattr(b.cudnn, "allow_tf32", v)),
        "cudnn.enabled": (lambda: b.cudnn.enabled, lambda v: setattr(b.cudnn, "enabled", v)),
        "cudnn.benchmark": (lambda: b.cudnn.benchmark, lambda v: setattr(b.cudnn, "benchmark", v)),
        "cudnn.deterministic": (lambda: b.cudnn.deterministic, lambda v: setattr(b.cudnn, "deterministic", v)),
        "mkldnn.enabled": (lambda: b.mkldnn.enabled, lambda v: setattr(b.mkldnn, "enabled", v)),
    }
    if hasattr(torch, "get_default_device"):
        flags["default_device"] = (lambda: str(torch.get_default_device()), lambda v: torch.set_default_device(v))
    return flags


def _namespaces() -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    return {"torch": torch, "torch.nn.functional": F, "torch.cuda": torch.cuda, "torch.nn.Module": torch.nn.Module,
            "torch.Tensor": torch.Tensor, "torch.testing": torch.testing}


class CodeCheck:
    """Whether functions still run the code objects they ran when the check was made, mostly without reading
    `__code__`: in the candidate's process every such read is an audited event, ~1.6 us through the monitor's hook
    on the CPU box, and a full look reads ~2,500 of them (~3 ms, 2.4 ms of it the hook's calls).

    For plain Python functions (types.FunctionType) one `gc.get_referents` over all of them (one audited event)
    lists each function's referents in order, its code object among them. A function's code is never NULL and is
    always a code object (the `__code__` setter checks), so a list that holds exactly as many code objects as there
    are functions, equal one by one to the trusted ones, means that no function's code changed. Any other list (a
    swap, or a code object stored in some function's `__doc__` or `__module__`) answers "changed", and the caller
    runs its exact per-function check. Other objects with a `__code__` (none in the harness today) are read
    directly."""

    def __init__(self, objs: list, codes: list) -> None:
        plain = [type(f) is types.FunctionType for f in objs]
        self._fns = list(itertools.compress(objs, plain))
        self._fn_codes = list(itertools.compress(codes, plain))
        other = [not p for p in plain]
        self._others = list(itertools.compress(objs, other))
        self._other_codes = list(itertools.compress(codes, other))

    def unchanged(self) -> bool:
        """True only when every function's code is the trusted one (False: look function by function)."""
        refs = gc.get_referents(*self._fns)
        seq = list(itertools.compress(refs, map(operator.is_, map(type, refs), itertools.repeat(types.CodeType))))
        if len(seq) != len(self._fn_codes) or not all(map(operator.is_, seq, self._fn_codes)):
            return False
        cur = map(getattr, self._others, itertools.repeat("__code__"), itertools.repeat(None))
        return all(map(operator.is_, cur, self._other_codes))


class StateSnapshot:
    """Trusted values of torch's flags and identities of its public callables (see module doc)."""

    def __init__(self, template: "StateSnapshot | None" = None) -> None:
        """template: a snapshot taken earlier in this process (or in the zygote it was forked from) while only
        trusted code had run since; its identities are reused and the few bindings trusted code changed since (the
        harness's own wrappers) re-read, which skips the full scan (and its audit events) per worker."""
        self.flags = _torch_flags()
        self.values = {}
        for k, (get, _) in self.flags.items():
            try:
                self.values[k] = get()
            except Exception:  # noqa: BLE001 - a flag this torch build does not have
                pass
        self.callables: dict[str, Any] = {}
        if template is not None:  # modules from the template (their dir() is the slow part), classes scanned anew
            self.callables = {k: e for k, e in template.callables.items() if not isinstance(e[0], type)}
            for key in template.replaced():
                if key not in template.callables:  # a key added to a class since: classes are scanned anew below
                    continue
                ns, n, _, _ = template.callables[key]
                if not isinstance(ns, type):
                    v = getattr(ns, n, None)
                    self.callables[key] = (ns, n, v, getattr(v, "__code__", None))
        # every key of each class's own __dict__: a name the class inherits (torch.Tensor's reshape, copy_, fill_
        # come from the C type torch._C.TensorBase, which cannot be changed) can still be shadowed by a new key on
        # the class itself, which no recorded callable shows (session 14's review forged a reward that way)
        self.class_keys = {n: (vars(ns), frozenset(vars(ns)))
                           for n, ns in _namespaces().items() if isinstance(ns, type)}
        for ns_name, ns in _namespaces().items():
            if template is not None and not isinstance(ns, type):
                continue
            d = vars(ns) if isinstance(ns, type) else {n: getattr(ns, n, None) for n in dir(ns)}
            for n, v in list(d.items()):
                if n.startswith("__") and n not in ("__call__", "__init__", "__torch_function__", "__torch_dispatch__"):
                    continue
                if isinstance(ns, type) and n.startswith("_") and not n.startswith("__"):
                    continue
                if not isinstance(ns, type) and n.startswith("_"):
                    continue
                if callable(v) or isinstance(v, (staticmethod, classmethod, property)):
                    self.callables[f"{ns_name}.{n}"] = (ns, n, v, getattr(v, "__code__", None))

    NUMERICS = ("default_dtype", "float32_matmul_precision", "cuda.matmul.allow_tf32", "cudnn.allow_tf32",
                "cuda.matmul.allow_fp16_reduced_precision_reduction", "default_device")

    def restore_flags(self) -> list[str]:
        """Put changed flags back; the names of those that had changed (numerics flags, which change what torch
        computes, are listed first by the caller as violations: see `NUMERICS`)."""
        changed = []
        for k, v in self.values.items():
            get, put = self.flags[k]
            try:
                if get() != v:
                    changed.append(f"{k} ({get()!r}, trusted {v!r})")
                    put(v)
            except Exception:  # noqa: BLE001
                pass
        return changed

    def _index(self) -> None:
        """Flat lists of the snapshot for `replaced`, which runs after every candidate phase: looked up with
        C-level map() over getattr (modules) and mappingproxy.get (a class's own __dict__), ~10x a Python loop."""
        groups: dict[bool, tuple[list, list, list, list]] = {True: ([], [], [], []), False: ([], [], [], [])}
        fn_keys, fn_objs, fn_codes = [], [], []
        for key, (ns, n, v, code) in self.callables.items():
            g = groups[isinstance(ns, type)]
            g[0].append(key)
            g[1].append(vars(ns) if isinstance(ns, type) else ns)
            g[2].append(n)
            g[3].append(v)
            if code is not None:
                fn_keys.append(key)
                fn_objs.append(v)
                fn_codes.append(code)
        self._idx = (groups[False], groups[True], (fn_keys, fn_objs, fn_codes))
        self._code_check = CodeCheck(fn_objs, fn_codes)

    def replaced(self) -> list[str]:
        """Torch callables that were replaced (or whose code was swapped) since the snapshot."""
        if not hasattr(self, "_idx"):
            self._index()
        mods, classes, (fn_keys, fn_objs, fn_codes) = self._idx
        cur_m = list(map(getattr, mods[1], mods[2], itertools.repeat(None)))
        cur_c = list(map(types.MappingProxyType.get, classes[1], classes[2]))
        added = [f"{n}.{k}" for n, (d, keys) in self.class_keys.items() if d.keys() != keys
                 for k in d if k not in keys]
        if not (any(map(operator.is_not, cur_m, mods[3])) or any(map(operator.is_not, cur_c, classes[3]))
                or added or not self._code_check.unchanged()):
            return []
        codes = list(map(getattr, fn_objs, itertools.repeat("__code__"), itertools.repeat(None)))
        out = added + [k for g, cur in ((mods, cur_m), (classes, cur_c)) for k, c, v in zip(g[0], cur, g[3])
                       if c is not v]
        out += [k for k, c, code in zip(fn_keys, codes, fn_codes) if c is not code and k not in out]
        return out


# ------------------------------------------------------------------------------------------------ guard bypasses
_BYPASS_C = ("_DisableTorchDispatch", "_pop_torch_dispatch_mode", "_unset_dispatch_mode", "_set_dispatch_mode",
             "_ExcludeDispatchKeyGuard", "_IncludeDispatchKeyGuard", "_dispatch_tls_set_dispatch_key_excluded",
             "_dispatch_tls_set_dispatch_key_included", "_DisableFuncTorch", "_DisableTorchFunction",
             "_DisableTorchFunctionSubclass", "_push_on_torch_dispatch_stack", "_set_torch_dispatch_mode",
             "_get_dispatch_mode", "_get_dispatch_stack_at", "_pop_torch_dispatch_stack")
_BYPASS_PY = ("_disable_current_modes", "_pop_mode_temporarily", "_pop_mode", "_push_mode",
              "_get_current_dispatch_mode", "_get_current_dispatch_mode_stack")
_GRAPH_CLASSES = ("_CUDAGraph", "_acceleratorGraph")  # torch.cuda.CUDAGraph's base, torch.accelerator.Graph's
_BRIDGES_TENSOR = ("numpy", "__array__", "tolist", "__dlpack__")
_BRIDGES_TORCH = ("from_numpy", "as_tensor", "asarray", "frombuffer", "from_dlpack")


def _wrap(monitor: Monitor, orig: Any, kind: str | None, what: str, direct: bool = True) -> Any:
    """orig behind the installed monitor: the wrapper raises CALL_EVENT and the monitor refuses the call (kind,
    what) when the caller is the solution (direct) or any frame of the solution is on the stack (not direct), else
    makes it. The wrapper holds neither orig nor the monitor (its closure: sys.audit; the monitor keeps orig under
    the wrapper's own code object, a copy made per wrapper)."""
    audit = sys.audit

    def wrapper(*a: Any, **k: Any) -> Any:
        box: list = []
        audit(CALL_EVENT, a, k, box)
        return box[0]

    name = getattr(orig, "__name__", "wrapper")
    wrapper.__code__ = wrapper.__code__.replace(co_name=name)  # a code object of its own: the monitor's key
    wrapper._cuda_agent_guard = True  # type: ignore[attr-defined]
    wrapper.__name__ = name
    wrapper.__qualname__ = getattr(orig, "__qualname__", name)
    monitor.register(wrapper, orig, kind, what, direct)
    return wrapper


def install_torch_wrappers(monitor: Monitor) -> None:
    """Refuse, when called directly by candidate code inside the harness's phases: ways around the dispatch guard
    (dispatch-mode stack and dispatch-key manipulation) and bridges that move tensor data to other libraries
    (`Tensor.numpy`, `torch.from_numpy`, DLPack): compute done there would bypass both the guard and the kernels.
    Count CUDA graph replays by the stream they go to (`launch_streams`), refuse a graph's raw handles to the
    solution, and drop torch.cuda.graphs' references to the cuda-python bindings (where installed)."""
    import torch
    import torch.utils._python_dispatch as pd

    for name in _BYPASS_C:
        orig = getattr(torch._C, name, None)
        if orig is not None and not getattr(orig, "_cuda_agent_guard", False):
            setattr(torch._C, name, _wrap(monitor, orig, "guard_bypass", f"torch._C.{name} called by the solution"))
    for name in _BYPASS_PY:
        orig = getattr(pd, name, None)
        if orig is not None and not getattr(orig, "_cuda_agent_guard", False):
            setattr(pd, name, _wrap(monitor, orig, "guard_bypass", f"torch.utils._python_dispatch.{name} called by "
                                                                   "the solution"))
    for name in _BRIDGES_TENSOR:
        orig = getattr(torch.Tensor, name, None)
        if orig is not None and not getattr(orig, "_cuda_agent_guard", False):
            setattr(torch.Tensor, name, _wrap(monitor, orig, "numpy_bridge", f"Tensor.{name}() called by the solution "
                                                                              "(compute outside its kernels)"))
    for name in _BRIDGES_TORCH:
        orig = getattr(torch, name, None)
        if orig is not None and not getattr(orig, "_cuda_agent_guard", False):
            setattr(torch, name, _wrap(monitor, orig, "numpy_bridge", f"torch.{name}() called by the solution "
                                                                       "(compute outside its kernels)"))
    # dynamo's frame-evaluation hook hands every Python frame evaluated later to a callback, with no audit event
    ef = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    orig = getattr(ef, "set_eval_frame", None)
    if orig is not None and not getattr(orig, "_cuda_agent_guard", False):
        w = _wrap(monitor, orig, "eval_frame", "set_eval_frame")
        ef.set_eval_frame = w
        for modname, mod in list(sys.modules.items()):  # torch's modules imported already keep their own names for it
            d = getattr(mod, "__dict__", None) if modname.startswith("torch") else None
            for name in ("set_eval_frame", "_maybe_set_eval_frame"):
                if type(d) is dict and d.get(name) is orig:
                    d[name] = w
    from sandbox.timing import raw_stream_reader

    handle = raw_stream_reader()
    for name in _GRAPH_CLASSES:
        cls = getattr(torch._C, name, None)
        count_graph_replays(monitor, cls, handle)
        # a graph's raw handles are for launching it through a CUDA binding (cudaGraphLaunch), unseen by the monitor
        for raw in ("raw_cuda_graph", "raw_cuda_graph_exec"):
            orig = getattr(cls, raw, None) if cls is not None else None
            if orig is not None and not getattr(orig, "_cuda_agent_guard", False):
                setattr(cls, raw, _wrap(monitor, orig, "ctypes", f"{raw}() called by the solution (a raw CUDA graph "
                                                                 "handle, for a launch nobody counts)", direct=False))
    # torch.cuda.graphs keeps the cuda-python bindings it imported, when installed (driver and runtime calls with no
    # ctypes lookup: launches and copies nobody counts): not within reach of the solution through torch
    graphs = sys.modules.get("torch.cuda.graphs")
    for name in ("_cuda_driver", "_cuda_runtime"):
        if graphs is not None and getattr(graphs, name, None) is not None:
            setattr(graphs, name, None)


def count_graph_replays(monitor: Monitor, graph_cls: Any, stream_handle: Any) -> None:
    """Wrap `graph_cls.replay` (torch._C._CUDAGraph's: torch.cuda.CUDAGraph.replay calls it; _acceleratorGraph's)
    so that the monitor counts each replay in `launch_streams` under `stream_handle()`, torch's current stream, where
    the replay goes (sandbox.timing.raw_stream_reader: builtins only, so nothing the solution can rebind runs while
    the monitor is busy). A graph's replay launches its kernels with no launch of the launcher's and no torch op:
    counted like a launch, a replay on another stream than the one the timing gate holds counts its call's whole
    wall clock (Timer.side_work). A no-op when there is no such method (CPU builds of torch have _CUDAGraph without
    it) or it is wrapped already."""
    orig = getattr(graph_cls, "replay", None) if graph_cls is not None else None
    if orig is not None and not getattr(orig, "_cuda_agent_guard", False):
        monitor._stream_handle = stream_handle
        setattr(graph_cls, "replay", _wrap(monitor, orig, "graph_replay", "a CUDA graph's replay", direct=False))


def install_ctypes_guards(monitor: Monitor) -> None:
    """Refuse ctypes' raw-memory helpers (memmove, memset: kind `memory_write`; _cast, _string_at, _wstring_at,
    which ctypes.cast / string_at call: `memory_read`) whenever the solution is on the stack (the foreign calls
    raise no audit event of their own on Linux, and the underscored ones skip string_at's), and remove the helpers'
    addresses from ctypes and _ctypes, from which a foreign function of the same kind could be made without any
    event. The launcher needs none of them (it passes `c_void_p(tensor.data_ptr())` to built kernels)."""
    import _ctypes
    import ctypes

    for name, kind in _CTYPES_PRIMITIVES:
        orig = getattr(ctypes, name, None)
        if orig is not None and not getattr(orig, "_cuda_agent_guard", False):
            setattr(ctypes, name, _wrap(monitor, orig, kind, f"ctypes.{name.lstrip('_')} called by the solution "
                                                              "(raw access to process memory)", direct=False))
    for mod in (ctypes, _ctypes):
        for attr in _CTYPES_ADDRS:
            if hasattr(mod, attr):
                delattr(mod, attr)
    monitor._funcptr_new = _install_funcptr_guard()


_FUNCPTR_DETAIL = ("a ctypes function pointer made from a raw address by the solution (calling it runs whatever "
                   "lies at that address, with no audit event)")


def _install_funcptr_guard() -> Any:
    """Refuse, whenever the solution is on the stack (GUARD_EVENT, kind `memory_read`), making a ctypes foreign
    function from an integer address (`CFUNCTYPE(...)(address)`, `CDLL(...)._FuncPtr(address)`, `type(fn)(address)`):
    such a call raises no audit event at all, so the pointer would read and write any memory. _ctypes.CFuncPtr's own
    constructor cannot be replaced (a static type), so every class derived from it gets a `__new__` that judges
    first: the ones that exist now, and, through ctypes._CFuncPtr (what CFUNCTYPE, PYFUNCTYPE and CDLL derive
    from) replaced by a guarded subclass, every later one; a later class that overrides `__new__` is refused when it
    is made. A class made on _ctypes.CFuncPtr itself (reached through `__mro__`), or a `__new__` put back, is found at
    the next boundary (`FuncPtrState.check`)."""
    import _ctypes
    import ctypes

    base = _ctypes.CFuncPtr
    if getattr(getattr(ctypes, "_CFuncPtr", None), "_cuda_agent_guard", False):
        return ctypes._CFuncPtr.__new__.__code__
    c_new = base.__new__
    audit = sys.audit
    detail = _FUNCPTR_DETAIL

    def __new__(cls, *a, **k):  # noqa: N807
        if a and isinstance(a[0], int):
            audit(GUARD_EVENT, "memory_read", detail, False)
        return c_new(cls, *a, **k)

    def __init_subclass__(cls, **k):  # noqa: N807
        if "__new__" in vars(cls) and vars(cls)["__new__"] is not guard:
            audit(GUARD_EVENT, "memory_read", f"{detail}: class {cls.__name__} replaces the sandbox's __new__", False)

    guard = staticmethod(__new__)
    guarded = type(base)("CFuncPtr", (base,), {"__new__": guard, "__init_subclass__": classmethod(__init_subclass__),
                                               "_flags_": ctypes._FUNCFLAG_CDECL, "_cuda_agent_guard": True,
                                               "__module__": "ctypes"})
    for cls in _funcptr_classes(base):
        if cls is not guarded and "__new__" not in vars(cls):
            cls.__new__ = guard
    ctypes._CFuncPtr = guarded
    return __new__.__code__  # (the monitor's: a frame of it is glue of ctypes, Monitor._launcher_lookup)


def _funcptr_classes(base: type) -> list[type]:
    """Every class derived from base (depth first)."""
    out: list[type] = []
    todo = list(type.__subclasses__(base))
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(type.__subclasses__(c))
    return out


class FuncPtrState:
    """The ctypes function-pointer classes as `_install_funcptr_guard` left them (build after it, before any solution
    code). `check()` lists, as violation strings, classes derived from _ctypes.CFuncPtr whose construction no longer
    reaches the guarded `__new__` (one made on the base itself, or a `__new__` replaced), and puts the guard back."""

    def __init__(self) -> None:
        import _ctypes
        import ctypes

        self._base = _ctypes.CFuncPtr
        self._new = ctypes._CFuncPtr.__new__ if getattr(ctypes._CFuncPtr, "_cuda_agent_guard", False) else None
        self._subclasses = type.__subclasses__

    def check(self) -> list[str]:
        if self._new is None:
            return []
        out = []
        for cls in _funcptr_classes(self._base):
            if getattr(cls, "__new__", None) is not self._new:
                try:
                    cls.__new__ = staticmethod(self._new)
                except (TypeError, AttributeError):
                    pass
                out.append(f"memory_read: {_FUNCPTR_DETAIL}: class {getattr(cls, '__name__', '?')} bypasses the "
                           "sandbox's constructor")
        return out[:4]


class HarnessSnapshot:
    """Identities of the harness's own functions in the candidate's process (the guard, the worker, the integrity
    hooks): replacing one is `harness_tampering`."""

    def __init__(self, objs: dict[str, tuple[Any, str]]):
        self.objs = {k: (owner, attr, getattr(owner, attr), getattr(getattr(owner, attr), "__code__", None))
                     for k, (owner, attr) in objs.items()}

    def replaced(self) -> list[str]:
        out = []
        for k, (owner, attr, v, code) in self.objs.items():
            cur = getattr(owner, attr, None)
            if cur is not v or getattr(cur, "__code__", None) is not code:
                out.append(k)
        return out


# ------------------------------------------------------------------------------------------------ hooks
_SIGNAL_SETTERS = ("signal", "setitimer", "alarm", "set_wakeup_fd", "siginterrupt")


def install_hook_guards(monitor: Monitor) -> None:
    """Refuse, when the solution is on the stack (any phase; GUARD_EVENT, kind `hook`): installing signal handlers
    or interval timers (`signal.signal`, `setitimer`, `alarm`, ...: a handler is handed the interrupted frame and runs
    wherever the harness is) and changing the collector's thresholds. Refuse, when the solution's own with-statement
    is the one whose exception is swallowed (kind `fallback`): `contextlib.suppress` and `ExitStack` doing what a try
    statement does. Whatever gets past these is found by `HookState.check` at the next boundary."""
    import _signal
    import contextlib
    import gc
    import signal

    for mod in (_signal, signal):
        for name in _SIGNAL_SETTERS:
            orig = getattr(mod, name, None)
            if orig is not None and not getattr(orig, "_cuda_agent_guard", False):
                setattr(mod, name, _wrap(monitor, orig, "hook", f"signal.{name} called by the solution (a signal handler runs "
                                                       "inside the harness)", direct=False))
    if not getattr(gc.set_threshold, "_cuda_agent_guard", False):
        gc.set_threshold = _wrap(monitor, gc.set_threshold, "hook", "gc.set_threshold called by the solution", direct=False)
    audit = sys.audit
    for cls in (contextlib.suppress, contextlib.ExitStack):
        orig = cls.__exit__
        if getattr(orig, "_cuda_agent_guard", False):
            continue

        def __exit__(self, *exc, _orig=orig, _name=cls.__name__):  # noqa: ANN001, N807
            swallowed = _orig(self, *exc)
            if swallowed and exc and exc[0] is not None:
                audit(GUARD_EVENT, "fallback", f"contextlib.{_name} swallowed a {exc[0].__name__} raised in the "
                                               "solution (a try statement in disguise)", True)
            return swallowed

        __exit__._cuda_agent_guard = True  # type: ignore[attr-defined]
        cls.__exit__ = __exit__


class HookState:
    """The process-wide callbacks through which code can run later inside the harness (see module doc), as they
    were when the worker was built (before any solution code). `check()` lists what changed since, as `hook: ...`
    violation strings, and puts everything back (so a hook left behind never fires in the harness). ~10 us."""

    def __init__(self) -> None:
        import _signal
        import gc
        import signal

        import torch

        self._gc = gc
        self._callbacks = gc.callbacks  # the list the collector calls (rebinding gc.callbacks does not change it)
        self.callbacks0 = tuple(gc.callbacks)
        self.threshold0 = gc.get_threshold()
        self._get_threshold = gc.get_threshold
        self._set_threshold = gc.set_threshold
        self._sigs = tuple(sorted(int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)))
        self._getsignal, self._signal = _signal.getsignal, _signal.signal
        self.handlers0 = tuple(map(self._getsignal, self._sigs))
        self._getitimer, self._setitimer = _signal.getitimer, _signal.setitimer
        self._timers = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
        self._sys = sys
        self._gettrace, self._settrace = sys.gettrace, sys.settrace
        self._getprofile, self._setprofile = sys.getprofile, sys.setprofile
        self.trace0, self.profile0 = sys.gettrace(), sys.getprofile()
        self._threading = threading
        self.thread_hooks0 = (getattr(threading, "_trace_hook", None), getattr(threading, "_profile_hook", None))
        self.unraisable0 = sys.unraisablehook
        self._mon = getattr(sys, "monitoring", None)  # Python 3.12+: tools with callbacks on every event
        self.tools0 = tuple(self._mon.get_tool(i) for i in range(6)) if self._mon is not None else ()
        C = torch._C
        self._len_tf, self._pop_tf = C._len_torch_function_stack, C._pop_torch_function_stack
        self._len_td, self._pop_td = C._len_torch_dispatch_stack, C._pop_torch_dispatch_stack
        self.tf0, self.td0 = self._len_tf(), self._len_td()

    def check(self) -> list[str]:
        out = []
        if self._len_tf() != self.tf0:
            n = self._len_tf() - self.tf0
            while self._len_tf() > self.tf0:
                self._pop_tf()
            out.append(f"hook: {n} torch function mode(s) left on the stack by the solution")
        if self._len_td() != self.td0:
            n = self._len_td() - self.td0
            while self._len_td() > self.td0:
                self._pop_td(None)
            out.append(f"hook: {n} torch dispatch mode(s) left on the stack by the solution")
        cb = self._callbacks
        if len(cb) != len(self.callbacks0) or any(a is not b for a, b in zip(cb, self.callbacks0)):
            cb[:] = self.callbacks0
            out.append("hook: a garbage-collector callback (gc.callbacks) was added by the solution")
        if self._get_threshold() != self.threshold0:
            self._set_threshold(*self.threshold0)
            out.append("hook: the garbage collector's thresholds were changed by the solution")
        handlers = tuple(map(self._getsignal, self._sigs))
        if handlers != self.handlers0:
            for s, h, h0 in zip(self._sigs, handlers, self.handlers0):
                if h is not h0:
                    self._signal(s, h0 if h0 is not None else 0)  # 0: SIG_DFL where no Python handler was set
                    out.append(f"hook: a handler for signal {s} was installed by the solution")
        for which in self._timers:
            if self._getitimer(which) != (0.0, 0.0):
                self._setitimer(which, 0.0)
                out.append(f"hook: an interval timer ({which}) was armed by the solution")
        if self._gettrace() is not self.trace0:
            self._settrace(self.trace0)
            out.append("hook: a trace function (sys.settrace) was left by the solution")
        if self._getprofile() is not self.profile0:
            self._setprofile(self.profile0)
            out.append("hook: a profile function (sys.setprofile) was left by the solution")
        th = self._threading
        if (getattr(th, "_trace_hook", None), getattr(th, "_profile_hook", None)) != self.thread_hooks0:
            th._trace_hook, th._profile_hook = self.thread_hooks0  # type: ignore[attr-defined]
            out.append("hook: threading.settrace / setprofile was called by the solution")
        if self._mon is not None:
            for i, t0 in enumerate(self.tools0):
                if self._mon.get_tool(i) != t0:
                    self._mon.set_events(i, 0)
                    if t0 is None:
                        self._mon.free_tool(i)
                    out.append(f"hook: a sys.monitoring tool ({i}) was registered by the solution")
        if self._sys.unraisablehook is not self.unraisable0:
            self._sys.unraisablehook = self.unraisable0
            out.append("hook: sys.unraisablehook was replaced by the solution")
        return out


# ------------------------------------------------------------------------------------------------ identities
# modules the harness in the candidate's process relies on (their callables must stay the ones loaded before it)
DEPENDENCIES = ("builtins", "os", "posix", "sys", "time", "select", "struct", "msgpack", "gc", "signal", "_signal",
                "threading", "_thread", "types", "operator", "itertools", "functools", "contextlib", "json",
                "secrets", "traceback", "importlib", "math", "stat", "warnings", "mmap", "fcntl", "ctypes")
_IMMUTABLE = (str, bytes, int, float, bool, complex, frozenset, tuple, type(None))


def _same_signature(a: tuple, b: tuple) -> bool:
    """Two IdentitySnapshot._signature tuples alike by identity, item by item (no __eq__ of theirs is called)."""
    if a[0] is not b[0] or a[1] is not b[1] or a[3] is not b[3] or (a[2] is None) is not (b[2] is None):
        return False
    return a[2] is None or (len(a[2]) == len(b[2]) and all(map(operator.is_, a[2], b[2])))


class IdentitySnapshot:
    """Identities (and code objects) of module attributes, class attributes and objects' own attributes (see
    module doc); `replaced()` names what changed since. Built from `add_*` calls, checked with C-level map()."""

    def __init__(self) -> None:
        self._keys: list[str] = []
        self._owners: list[Any] = []  # a module, a class's mappingproxy or an instance's __dict__
        self._names: list[str] = []
        self._vals: list[Any] = []
        self._fn_keys: list[str] = []
        self._fn_objs: list[Any] = []
        self._fn_codes: list[Any] = []
        self._getters: list[Any] = []
        # foreign functions (ctypes): their errcheck, restype and argtypes can be changed in place, the object kept
        self._cf_keys: list[str] = []
        self._cf_objs: list[Any] = []
        self._cf_sigs: list[tuple] = []
        self._code_check: tuple[int, CodeCheck] | None = None  # (functions it covers, the check): see replaced

    @staticmethod
    def _signature(f: Any) -> tuple:
        """(errcheck, restype, argtypes' items, argtypes) of a ctypes foreign function, compared item by item by
        identity (the argtypes sequence as set is kept as given, and a list can be changed in place)."""
        args = f.argtypes
        return (f.errcheck, f.restype, None if args is None else tuple(args), args)

    def _add(self, key: str, owner: Any, name: str, v: Any, getter: Any) -> None:
        self._keys.append(key)
        self._owners.append(owner)
        self._names.append(name)
        self._vals.append(v)
        self._getters.append(getter)
        if isinstance(v, ctypes._CFuncPtr):
            self._cf_keys.append(key)
            self._cf_objs.append(v)
            self._cf_sigs.append(self._signature(v))
        for f in (v, getattr(v, "__func__", None), getattr(v, "fget", None), getattr(v, "fset", None)):
            code = getattr(f, "__code__", None) if f is not None else None
            if isinstance(code, types.CodeType):
                self._fn_keys.append(key)
                self._fn_objs.append(f)
                self._fn_codes.append(code)

    def add_module(self, mod: Any, deep: bool) -> None:
        """deep (the harness's own modules): every global that is a function, class, module or immutable value,
        and the attributes of the classes defined there; else: callables and submodules only."""
        name = mod.__name__
        d = vars(mod)
        for n, v in list(d.items()):
            if n.startswith("__") and n.endswith("__") and n not in ("__import__", "__build_class__"):
                continue
            if deep:
                if not (callable(v) or isinstance(v, (types.ModuleType,) + _IMMUTABLE)) or v is None:
                    continue
            elif not (callable(v) or isinstance(v, types.ModuleType)):
                continue
            self._add(f"{name}.{n}", d, n, v, dict.get)
            if deep and isinstance(v, type) and getattr(v, "__module__", None) == name:
                self.add_class(v, f"{name}.{n}")

    def add_class(self, cls: type, label: str | None = None) -> None:
        label = label or f"{cls.__module__}.{cls.__qualname__}"
        d = vars(cls)
        for n, v in list(d.items()):
            if n in ("__dict__", "__weakref__", "__doc__", "__module__", "__annotations__", "__slots__",
                     "__parameters__", "__orig_bases__", "__abstractmethods__", "_abc_impl"):
                continue
            self._add(f"{label}.{n}", d, n, v, types.MappingProxyType.get)

    def add_attrs(self, obj: Any, names: list[str], label: str) -> None:
        """Attributes of one trusted object (its own __dict__)."""
        d = vars(obj)
        for n in names:
            if n in d:
                self._add(f"{label}.{n}", d, n, d[n], dict.get)

    def refresh(self, key: str) -> None:
        """Take the value of `key` ("label.name" of add_attrs) as it is now: for the harness's own update of a trusted
        attribute, while no solution code exists (sandbox.candidate: the gate latency, re-measured before load)."""
        for i, k in enumerate(self._keys):
            if k == key:
                self._vals[i] = self._getters[i](self._owners[i], self._names[i])

    def replaced(self) -> list[str]:
        cur = list(map(_get, self._getters, self._owners, self._names))
        sigs = [k for k, f, sig in zip(self._cf_keys, self._cf_objs, self._cf_sigs)
                if not _same_signature(self._signature(f), sig)]
        check = self._code_check
        if check is None or check[0] != len(self._fn_objs):  # built at the first look, again after an add
            check = self._code_check = (len(self._fn_objs), CodeCheck(self._fn_objs, self._fn_codes))
        if not (any(map(operator.is_not, cur, self._vals)) or not check[1].unchanged() or sigs):
            return []
        codes = list(map(getattr, self._fn_objs, itertools.repeat("__code__"), itertools.repeat(None)))
        out = [k for k, c, v in zip(self._keys, cur, self._vals) if c is not v]
        out += [k for k, c, code in zip(self._fn_keys, codes, self._fn_codes) if c is not code and k not in out]
        out += [f"{k} (its errcheck, restype or argtypes)" for k in sigs if k not in out]
        return out


def _get(getter: Any, owner: Any, name: str) -> Any:
    return getter(owner, name)


def harness_identities(extra: dict[str, Any] | None = None) -> IdentitySnapshot:
    """The IdentitySnapshot of this process's harness now (call before any solution code): every sandbox.* module
    (deep) and the DEPENDENCIES (callables); extra: {label: (object, [attribute names])} of trusted instances."""
    snap = IdentitySnapshot()
    for name, mod in sorted(sys.modules.items()):
        if mod is None or not isinstance(mod, types.ModuleType):
            continue
        if name == "sandbox" or name.startswith("sandbox."):
            snap.add_module(mod, deep=True)
        elif name in DEPENDENCIES:
            snap.add_module(mod, deep=False)
    for label, (obj, names) in (extra or {}).items():
        snap.add_attrs(obj, names, label)
    return snap
