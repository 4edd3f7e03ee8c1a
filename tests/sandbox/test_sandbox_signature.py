import pytest

from sandbox.signature import SignatureError, parse_entry_points


def test_cuda_entry_points_with_qualifiers_blocks_and_comments():
    src = r'''
#include <cuda_fp16.h>
// extern "C" __global__ void commented_out(float* x) {}
__device__ float helper(float x) { return x; }
extern "C" __global__ void __launch_bounds__(256) relu(const float* __restrict__ x, float* __restrict__ out, int n) {
    if (n) { out[0] = helper(x[0]); }
}
extern "C" {
__global__ void k2(double *a, long long n, unsigned int m, const __half* h, void* any) {}
}
template <int N> __global__ void templated(float* x) {}
__global__ void not_exported(float* x) {}
'''
    sigs = parse_entry_points(src, "kernels/a.cu")
    assert [s.name for s in sigs] == ["relu", "k2"]
    relu = sigs[0]
    assert [(p.name, p.ctype, p.pointer, p.const, p.dtype) for p in relu.params] == [
        ("x", "float", True, True, "float32"), ("out", "float", True, False, "float32"), ("n", "int", False, False, "")]
    k2 = sigs[1]
    assert [p.dtype for p in k2.params] == ["float64", "", "", "float16", "any"]
    assert k2.params[3].const


def test_c_file_exports_non_static_void_functions():
    src = "static void helper(float* x) {}\nvoid run(const float* x, float* y, int64_t n) { for(;;){} }\nint f(int);\n"
    assert [s.name for s in parse_entry_points(src, "kernels/a.c")] == ["run"]


def test_cpp_file_needs_extern_c():
    src = 'extern "C" void run(const float* x, float* y, int64_t n) { }\nvoid other(float* x) {}\n'
    assert [s.name for s in parse_entry_points(src, "kernels/a.cpp")] == ["run"]


@pytest.mark.parametrize("bad", [
    'extern "C" int returns_int(float* x) { return 0; }',
    'extern "C" void refs(float& x) {}',
    'extern "C" void ptrptr(float** x) {}',
    'extern "C" void structs(MyStruct s) {}',
])
def test_unsupported_signatures_are_named(bad):
    with pytest.raises(SignatureError) as e:
        parse_entry_points(bad, "kernels/a.cpp")
    assert "kernels/a.cpp" in str(e.value)
