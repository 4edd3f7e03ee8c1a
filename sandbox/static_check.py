"""Static checks that run before anything is built or imported: model_new.py rules, kernel source rules, and the
undefined-symbol allow-list of a built shared library (`nm -D`).

Each check returns a list of `Violation`; an empty list means the check passed. These catch the plain cases
cheaply; the runtime guards (sandbox.guard, the import hook in the candidate worker) catch what a static look
cannot.
"""

from __future__ import annotations

import ast
import re
import subprocess

from sandbox.result import Violation

ALLOWED_IMPORTS = {
    "torch", "torch.nn", "torch.nn.functional", "math", "typing", "dataclasses", "functools", "collections",
    "__future__", "os", "os.path", "sandbox.runtime", "sandbox",
}
EXTENSION_IMPORTS = {"torch.utils.cpp_extension", "torch.utils"}
FORBIDDEN_CALLS = {"exec", "eval", "compile", "__import__", "globals", "vars", "breakpoint", "open"}
FORBIDDEN_ATTRS = {"__globals__", "__builtins__", "__subclasses__", "__code__", "__closure__", "__dict__",
                   "__bases__", "__mro__", "__getattribute__", "f_back", "f_globals", "f_locals", "gi_frame",
                   "modules", "_getframe", "system", "popen", "fork", "execv", "execve", "spawnv", "kill",
                   "launch_counts", "_count", "ctypes", "tb_frame", "_C", "sys"}


# methods through which a class of the solution runs code out of the harness's sight
_HOOK_METHODS = {"__exit__": "a context manager can swallow exceptions like a try statement",
                 "__aexit__": "a context manager can swallow exceptions like a try statement",
                 "__del__": "a finalizer runs whenever the garbage collector frees the object, inside the harness"}


def allowed_imports(fmt: str) -> set[str]:
    """Modules model_new.py may import in format `fmt` (anything else is forbidden)."""
    return ALLOWED_IMPORTS | (EXTENSION_IMPORTS if fmt == "extension" else set())


def check_model_new(src: str, fmt: str) -> tuple[list[Violation], str | None]:
    """Check model_new.py. Returns (violations, syntax_error): syntax_error is a message when it does not parse."""
    try:
        tree = ast.parse(src, filename="model_new.py")
    except SyntaxError as e:
        return [], f"model_new.py:{e.lineno}: {e.msg}"
    allowed = allowed_imports(fmt)
    out: list[Violation] = []
    has_model_new = False
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name not in allowed:
                    out.append(Violation("import", f"model_new.py:{line}: import {a.name} is not allowed"))
        elif isinstance(node, ast.ImportFrom):
            mod = ("." * node.level) + (node.module or "")
            if node.level or mod not in allowed:
                out.append(Violation("import", f"model_new.py:{line}: from {mod} import ... is not allowed"))
            elif mod == "sandbox":
                for a in node.names:
                    if a.name != "runtime":
                        out.append(Violation("import", f"model_new.py:{line}: from sandbox import {a.name} is not allowed"))
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            out.append(Violation("static", f"model_new.py:{line}: try/except is not allowed (no fallbacks)"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            out.append(Violation("static", f"model_new.py:{line}: call of {node.func.id}() is not allowed"))
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS:
            out.append(Violation("static", f"model_new.py:{line}: access to .{node.attr} is not allowed"))
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__"):
            out.append(Violation("static", f"model_new.py:{line}: use of {node.id} is not allowed"))
        elif isinstance(node, ast.ClassDef):
            if node.name == "ModelNew":
                has_model_new = True
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in _HOOK_METHODS:
                    out.append(Violation("static", f"model_new.py:{item.lineno}: {node.name}.{item.name} is not "
                                                   f"allowed ({_HOOK_METHODS[item.name]})"))
            for b in node.bases:
                name = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                if name == "Model":
                    out.append(Violation("static", f"model_new.py:{line}: {node.name} subclasses the reference Model"))
    if not has_model_new:
        return out, "model_new.py defines no class ModelNew"
    return out, None


_FORBIDDEN_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]\s*(torch/|ATen/|c10/|pybind11/|Python\.h|caffe2/)', re.M)
_ASM = re.compile(r"\b(__asm__|__asm|asm)\b\s*(volatile\s*|__volatile__\s*|goto\s*)*\(")
_SYSCALL = re.compile(r"\bsyscall\s*\(")


def check_kernel_sources(files: dict[str, str], fmt: str) -> list[Violation]:
    """Rules on kernels/* sources: no torch/Python headers (cubin, cpu), no inline asm or raw syscalls (cpu)."""
    out: list[Violation] = []
    for path, src in sorted(files.items()):
        if not path.startswith("kernels/"):
            continue
        if fmt in ("cubin", "cpu"):
            for m in _FORBIDDEN_INCLUDE.finditer(src):
                line = src.count("\n", 0, m.start()) + 1
                out.append(Violation("static", f"{path}:{line}: #include <{m.group(1)}...> is not allowed in the {fmt} format"))
        if fmt == "cpu":
            for rx, what in ((_ASM, "inline assembly"), (_SYSCALL, "raw syscall()")):
                for m in rx.finditer(src):
                    line = src.count("\n", 0, m.start()) + 1
                    out.append(Violation("static", f"{path}:{line}: {what} is not allowed in host kernels"))
    return out


_MATH = {
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "exp",
    "exp2", "expm1", "log", "log2", "log10", "log1p", "logb", "pow", "sqrt", "cbrt", "hypot", "erf", "erfc", "lgamma",
    "tgamma", "fabs", "floor", "ceil", "round", "lround", "llround", "trunc", "fmod", "remainder", "fmin", "fmax",
    "fma", "ldexp", "frexp", "modf", "nearbyint", "rint", "lrint", "llrint", "copysign", "nextafter", "scalbn",
    "ilogb", "fdim", "sincos",
}
_ALLOWED_SYMBOLS_RX = [
    re.compile(r"^(%s)[fl]?(_finite)?$" % "|".join(sorted(_MATH))),
    re.compile(r"^__(%s)[fl]?_finite$" % "|".join(sorted(_MATH))),
    re.compile(r"^_ZGV[a-zA-Z0-9]+_(%s)[fl]?$" % "|".join(sorted(_MATH))),  # libmvec vector math
    re.compile(r"^(memcpy|memmove|memset|memcmp|malloc|calloc|realloc|free|aligned_alloc|posix_memalign|strlen|"
               r"strcmp|strncmp|abort|qsort|abs|labs|llabs|printf|puts|putchar|fprintf|fputs|fputc|fwrite|fflush|"
               r"stderr|stdout|__stack_chk_fail|__assert_fail|__cxa_finalize|__gmon_start__|__tls_get_addr|"
               r"__dso_handle|__errno_location|__isnan|__isnanf|__isinf|__isinff|__fpclassify|__fpclassifyf|"
               r"__signbit|__signbitf|__isoc99_sscanf|__isoc23_sscanf|snprintf|__snprintf_chk|sprintf|__sprintf_chk|"
               r"__memcpy_chk|__memset_chk|__memmove_chk|__printf_chk|__fprintf_chk|__vfprintf_chk|vfprintf)$"),
    re.compile(r"^_ITM_"),
    re.compile(r"^(GOMP_|omp_)"),  # OpenMP runtime
    re.compile(r"^(__cxa_|__gxx_personality_v0$|_Unwind_Resume$|__dynamic_cast$)"),
    re.compile(r"^_Z(n[wa]|d[la])"),  # operator new / delete
    re.compile(r"^_ZSt"),  # std:: free functions (throw helpers, terminate)
    re.compile(r"^_ZN?K?St"),  # std:: members (filtered below)
    re.compile(r"^_ZTV|^_ZTI|^_ZTS"),  # vtables / typeinfo of std classes
    re.compile(r"^_ZN9__gnu_cxx"),
]
_DENY_IN_STD = re.compile(r"thread|fstream|filebuf|random_device|system|ifstream|ofstream|chrono|condition")
_BLAS_RX = re.compile(r"^(cblas_\w+|[sdcz](gemm|gemv|axpy|dot|scal|syrk|trsm|trmm|ger)_?)$")


def undefined_symbols(so_path: str) -> list[str]:
    """Undefined dynamic symbols of a shared library (`nm -D --undefined-only`), version suffixes removed."""
    p = subprocess.run(["nm", "-D", "--undefined-only", so_path], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"nm failed on {so_path}: {p.stderr.strip()}")
    syms = []
    for line in p.stdout.splitlines():
        parts = line.split()
        if not parts:
            continue
        name = parts[-1].split("@")[0]
        syms.append(name)
    return sorted(set(syms))


_SYSCALL_INSN = re.compile(r"\t(syscall|sysenter|int\s+\$0x80|svc\s+#?0)\b")


def check_instructions(so_path: str) -> list[Violation]:
    """Violations for system-call instructions in the built library's machine code (`objdump -d`): a kernel that
    issues system calls itself bypasses the undefined-symbol allow-list, however its source spells the asm."""
    try:
        p = subprocess.run(["objdump", "-d", "--no-show-raw-insn", so_path], capture_output=True, text=True,
                           timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [Violation("symbol", f"could not disassemble the built library: {e}")]
    if p.returncode != 0:
        return [Violation("symbol", f"objdump failed on the built library: {p.stderr.strip()[:200]}")]
    func = "?"
    for line in p.stdout.splitlines():
        if line.endswith(">:"):
            func = line.split("<", 1)[-1].rstrip(">:")
        elif _SYSCALL_INSN.search(line):
            what = _SYSCALL_INSN.search(line).group(1)
            return [Violation("symbol", f"the built library issues system calls itself ({what} in {func})")]
    return []


def check_symbols(so_path: str, allow_blas: bool = False) -> list[Violation]:
    """Violations for each undefined symbol of the built library outside the allow-list (see FORMATS.md)."""
    out: list[Violation] = []
    for s in undefined_symbols(so_path):
        if s.startswith(("_ZNSt", "_ZNKSt", "_ZSt")) and _DENY_IN_STD.search(s):
            out.append(Violation("symbol", f"the built library calls {s} (threads, files and clocks are not allowed)"))
            continue
        if any(rx.search(s) for rx in _ALLOWED_SYMBOLS_RX):
            continue
        if allow_blas and _BLAS_RX.match(s):
            continue
        what = "a torch symbol" if s.startswith(("_ZN2at", "_ZN3c10", "_ZN5torch")) else "a symbol outside the allow-list"
        out.append(Violation("symbol", f"the built library calls {s}: {what}"))
    return out
