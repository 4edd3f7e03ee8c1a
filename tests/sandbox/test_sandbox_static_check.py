import subprocess

import pytest

from sandbox.static_check import check_kernel_sources, check_model_new, check_symbols

GOOD = """
import torch
import torch.nn as nn
from sandbox.runtime import load_kernels
K = load_kernels()
class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        K.k(x, out, x.numel())
        return out
"""


def test_good_model_new_passes():
    assert check_model_new(GOOD, "cpu") == ([], None)


@pytest.mark.parametrize("snippet,what", [
    ("import numpy as np", "numpy"),
    ("import subprocess", "subprocess"),
    ("import ctypes", "ctypes"),
    ("from model import Model", "from model"),
    ("import model", "import model"),
    ("from sandbox import evaluator", "sandbox import evaluator"),
    ("import torch.utils.cpp_extension", "cpp_extension"),
    ("x = eval('1')", "eval"),
    ("__import__('os')", "__import__"),
    ("try:\n    pass\nexcept Exception:\n    pass", "try/except"),
    ("import sys\nsys.modules", "sys"),
    ("class Bad(Model):\n    pass", "subclasses the reference"),
])
def test_forbidden_patterns_are_named(snippet, what):
    viol, syntax = check_model_new(GOOD + "\n" + snippet + "\n", "cpu")
    assert syntax is None
    assert viol and any(what in v.detail for v in viol), viol


def test_extension_format_may_import_cpp_extension():
    src = GOOD + "\nfrom torch.utils.cpp_extension import load_inline\n"
    assert check_model_new(src, "extension")[0] == []
    assert check_model_new(src, "cpu")[0]


def test_syntax_error_and_missing_model_new():
    assert "model_new.py:1" in check_model_new("def (", "cpu")[1]
    assert "no class ModelNew" in check_model_new("import torch\n", "cpu")[1]


def test_kernel_source_rules():
    files = {"kernels/a.cu": "#include <torch/extension.h>\n", "kernels/b.cpp": 'void f(){ asm volatile("nop"); }',
             "kernels/c.cpp": "long f(){ return syscall(39); }"}
    v = check_kernel_sources(files, "cpu")
    text = " ".join(x.detail for x in v)
    assert "kernels/a.cu:1" in text and "inline assembly" in text and "syscall" in text
    assert check_kernel_sources({"kernels/a.cu": "#include <torch/extension.h>\n"}, "extension") == []


def _so(tmp_path, src: str) -> str:
    (tmp_path / "k.cpp").write_text(src)
    so = tmp_path / "k.so"
    subprocess.run(["g++", "-O2", "-fPIC", "-shared", "-fopenmp", str(tmp_path / "k.cpp"), "-o", str(so)], check=True)
    return str(so)


def test_symbol_allow_list_accepts_math_openmp_and_cxx_runtime(tmp_path):
    so = _so(tmp_path, """
#include <math.h>
#include <vector>
#include <stdio.h>
extern "C" void k(const float* x, float* y, long n) {
    std::vector<float> tmp(n);
    #pragma omp parallel for
    for (long i = 0; i < n; i++) tmp[i] = expf(x[i]) + tanhf(x[i]);
    for (long i = 0; i < n; i++) y[i] = tmp[i];
    if (n < 0) printf("negative\\n");
}""")
    assert check_symbols(so) == []


def test_symbol_allow_list_rejects_process_and_file_calls(tmp_path):
    so = _so(tmp_path, """
#include <stdlib.h>
#include <stdio.h>
extern "C" void k(float* y) { y[0] = system("true"); FILE* f = fopen("/tmp/x", "w"); y[1] = f != 0; }""")
    names = " ".join(v.detail for v in check_symbols(so))
    assert "system" in names and "fopen" in names
