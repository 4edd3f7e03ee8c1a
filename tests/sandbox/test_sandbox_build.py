"""Builds with real compilers: host compiler (cpu) and nvcc -cubin (compile only, no GPU needed)."""

import json
import shutil

import pytest

from sandbox.build import build, jail_for_build, truncate_log
from sandbox.config import SandboxConfig
from sandbox.jail import probe
from sandbox.workspace import Workspace, WorkspaceError

CPU_SRC = 'extern "C" void k(const float* x, float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = 2 * x[i]; }\n'
CU_SRC = '''
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
'''
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def _ws(tmp_path, files, fmt, owner=-1):
    return Workspace.create(tmp_path / "ws", "ref", {"model_new.py": "", **files}, fmt, owner_uid=owner)


def test_cpu_build_manifest_and_cache(tmp_path):
    cfg = SandboxConfig(cache_dir=str(tmp_path / "cache"))
    r1 = build(_ws(tmp_path, {"kernels/k.cpp": CPU_SRC}, "cpu"), "cpu", cfg, None)
    assert r1.ok and not r1.cached
    m = json.loads(open(r1.manifest_path).read())
    assert m["format"] == "cpu" and m["artifacts"][0]["entry_points"][0]["name"] == "k"
    r2 = build(_ws(tmp_path, {"kernels/k.cpp": CPU_SRC}, "cpu"), "cpu", cfg, None)
    assert r2.ok and r2.cached and r2.key == r1.key
    r3 = build(_ws(tmp_path, {"kernels/k.cpp": CPU_SRC + "// changed\n"}, "cpu"), "cpu", cfg, None)
    assert r3.ok and not r3.cached and r3.key != r1.key


def test_cpu_compile_error_has_relative_paths_and_is_cached(tmp_path):
    cfg = SandboxConfig(cache_dir=str(tmp_path / "cache"))
    ws = _ws(tmp_path, {"kernels/bad.cpp": 'extern "C" void k(float* x) { x[0] = undefined_name; }\n'}, "cpu")
    r = build(ws, "cpu", cfg, None)
    assert not r.ok and r.status == "compile_error"
    assert "kernels/bad.cpp:1" in r.log and "undefined_name" in r.log
    assert str(ws.path) not in r.log
    again = build(_ws(tmp_path, {"kernels/bad.cpp": 'extern "C" void k(float* x) { x[0] = undefined_name; }\n'}, "cpu"),
                  "cpu", cfg, None)
    assert again.cached and again.log == r.log


def test_forbidden_symbol_fails_the_build(tmp_path):
    cfg = SandboxConfig(cache_dir=str(tmp_path / "cache"))
    src = '#include <stdlib.h>\nextern "C" void k(float* x) { x[0] = (float)system("id"); }\n'
    r = build(_ws(tmp_path, {"kernels/k.cpp": src}, "cpu"), "cpu", cfg, None)
    assert not r.ok and r.status == "forbidden" and "system" in r.violations[0].detail


def test_no_entry_point_and_bad_signature(tmp_path):
    cfg = SandboxConfig(cache_dir=str(tmp_path / "cache"))
    r = build(_ws(tmp_path, {"kernels/k.cpp": "void k(float* x) {}\n"}, "cpu"), "cpu", cfg, None)
    assert r.status == "compile_error" and "extern" in r.log
    r = build(_ws(tmp_path, {"kernels/k.cpp": 'extern "C" void k(float** x) {}\n'}, "cpu"), "cpu", cfg, None)
    assert r.status == "compile_error" and "pointers to pointers" in r.log


def test_diagnostics_are_truncated(tmp_path):
    text = "x" * 10000
    out = truncate_log(f"{tmp_path}/kernels/a.cu:1: " + text, tmp_path, 500)
    assert out.startswith("kernels/a.cu:1") and "truncated" in out and len(out) < 600


def test_workspace_rules(tmp_path):
    for files, match in [({}, "no model_new.py"), ({"model_new.py": "", "../x.cpp": ""}, "kernels/"),
                         ({"model_new.py": "", "kernels/a.cu": ""}, "suffix"),
                         ({"model_new.py": "", "kernels/sub/a.cpp": ""}, "kernels/"),
                         ({"model_new.py": "", "model.py": ""}, "kernels/")]:
        with pytest.raises(WorkspaceError, match=match):
            Workspace.create(tmp_path, "ref", files, "cpu")


@pytest.mark.skipif(not probe(65534)[0], reason="namespace isolation unavailable (needs root and unshare)")
def test_confined_build_works(tmp_path):
    cfg = SandboxConfig(cache_dir=str(tmp_path / "cache"))
    ws = _ws(tmp_path, {"kernels/k.cpp": CPU_SRC}, "cpu", owner=65534)
    r = build(ws, "cpu", cfg, jail_for_build(ws, cfg))
    assert r.ok, r.log


@needs_nvcc
def test_cubin_build_cache_and_errors(tmp_path):
    cfg = SandboxConfig(cache_dir=str(tmp_path / "cache"))
    r = build(_ws(tmp_path, {"kernels/scale.cu": CU_SRC}, "cubin"), "cubin", cfg, None, "sm_90a")
    assert r.ok, r.log
    m = json.loads(open(r.manifest_path).read())
    art = m["artifacts"][0]
    assert art["kind"] == "cubin" and art["entry_points"][0]["name"] == "scale"
    assert open(art["path"], "rb").read(4) == b"\x7fELF"
    again = build(_ws(tmp_path, {"kernels/scale.cu": CU_SRC}, "cubin"), "cubin", cfg, None, "sm_90a")
    assert again.cached
    other_arch = build(_ws(tmp_path, {"kernels/scale.cu": CU_SRC}, "cubin"), "cubin", cfg, None, "sm_80")
    assert other_arch.ok and not other_arch.cached
    bad = build(_ws(tmp_path, {"kernels/scale.cu": CU_SRC.replace("a * x[i]", "a * x[i] + missing")}, "cubin"),
                "cubin", cfg, None, "sm_90a")
    assert bad.status == "compile_error" and "kernels/scale.cu" in bad.log and "missing" in bad.log


@needs_nvcc
def test_cubin_rejects_torch_headers_statically():
    from sandbox.static_check import check_kernel_sources

    v = check_kernel_sources({"kernels/a.cu": "#include <ATen/ATen.h>\n" + CU_SRC}, "cubin")
    assert v and "ATen" in v[0].detail


def _incbin_src(path: str) -> str:
    """A cpu kernel whose library embeds the bytes of `path` (the assembler's .incbin reads it at build time)."""
    return CPU_SRC + ('__asm__(".section .rodata\\n.Lblob:\\n.incbin \\"%s\\"\\n.byte 0\\n.previous\\n");\n' % path)


@pytest.mark.skipif(not probe(65534)[0], reason="namespace isolation unavailable (needs root and unshare)")
def test_confined_build_sees_no_trusted_file_and_no_trusted_environment(tmp_path, monkeypatch):
    """A build that embeds files with .incbin: the workspace's reference copy cannot be read (concealed), a file of
    the repository outside sandbox/ does not exist; each against the same build unconfined, where the file is
    read. The compilers' environment holds none of the trusted side's variables."""
    from sandbox.build import REPO_ROOT

    secret = "cuda-agent-test-secret-5c1e"
    monkeypatch.setenv("CUDA_AGENT_TEST_SECRET", secret)
    marker = "REFERENCE_MARKER_9d2f"

    def built(files, confined: bool, sub: str):
        cfg = SandboxConfig(cache_dir=str(tmp_path / sub / "cache"))  # a cache per build: the same sources each time
        ws = Workspace.create(tmp_path / sub, f"# {marker}\n", {"model_new.py": "", **files}, "cpu",
                              owner_uid=65534 if confined else -1)
        r = build(ws, "cpu", cfg, jail_for_build(ws, cfg) if confined else None)
        so = (ws.build_dir / json.loads(open(r.manifest_path).read())["artifacts"][0]["file"]).read_bytes() \
            if r.ok else b""
        return r, so

    ref_src = _incbin_src("model.py")  # the compilers run in the workspace
    r, so = built({"kernels/k.cpp": ref_src}, False, "open")
    assert r.ok and marker.encode() in so, r.log  # control: unconfined, the reference copy is read
    r, so = built({"kernels/k.cpp": ref_src}, True, "jailed")
    assert marker.encode() not in so and (r.ok or "model.py" in r.log), r.log  # concealed: mode 000, empty

    repo_file = str(REPO_ROOT / "pyproject.toml")
    r, so = built({"kernels/k.cpp": _incbin_src(repo_file)}, False, "open2")
    assert r.ok and b"[project]" in so, r.log
    r, _ = built({"kernels/k.cpp": _incbin_src(repo_file)}, True, "jailed2")
    assert not r.ok and r.status == "compile_error" and "pyproject.toml" in r.log, r.log

    # the compilers' environment (what /proc/self/environ would show a compiler that reads it: gcc 12's
    # preprocessor and assembler read it as empty, a size-0 file)
    from sandbox.build import build_env

    env = build_env(Workspace.create(tmp_path / "env", "", {"model_new.py": ""}, "cpu"))
    assert secret not in env.values() and "CUDA_AGENT_TEST_SECRET" not in env and env["PATH"]
