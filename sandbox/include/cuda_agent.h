/* cuda_agent.h: helper functions for solutions in the cpu and cubin formats (sandbox/FORMATS.md).

   #include "cuda_agent.h"      (the sandbox puts this folder on the include path of every cpu and cubin build)

   - DEV: `static inline` on the CPU, `__device__ __forceinline__` under nvcc: prefix your own helpers with it.
   - Scalar activations named after torch's: relu_f, relu6_f, sigmoid_f, silu_f, gelu_erf_f, gelu_tanh_f,
     softplus_f(x, beta, threshold), elu_f(x, alpha), celu_f(x, alpha), selu_f, leaky_relu_f(x, slope),
     hardtanh_f(x, lo, hi), hardswish_f, hardsigmoid_f, mish_f, softsign_f, logsigmoid_f, tanhshrink_f,
     softshrink_f(x, l), hardshrink_f(x, l), neg_f, rsqrt_f, square_f, reciprocal_f, prelu_f(x, w),
     logaddexp_f(a, b); plus the C math functions (expf, logf, log1pf, sqrtf, tanhf, erff, sinf, cosf, atanf,
     fabsf, fmaxf, fminf).
   - AT(p, i): element i of the output reads parameter p broadcast over it, p[(i / p_inner) % p_count], for a
     kernel parameter list `const float* p, long long p_count, long long p_inner` (the Python side passes
     `*sandbox.runtime.bcast(p, x)`).
   - cpu only: unless CA_LIBM_MATH is defined before the include, expf, logf, log1pf, sqrtf, tanhf, erff, sinf,
     cosf, atanf, fabsf, fmaxf and fminf are replaced by branch-free versions without libm calls that gcc
     vectorises (relative error about 1e-6 on the ranges tasks use).
   - cubin only: NTHREADS (256) and block_reduce(v, op), a block-wide reduction (op 0 sum, 1 max, 2 min) whose
     result every thread of the block gets.
   The header only defines inline functions and macros: a build that includes it has no extra symbols.
   The fused family's demonstrations (tasks/demos) include it rather than a copy: their tests check a change here. */
#ifndef CUDA_AGENT_H
#define CUDA_AGENT_H
#include <math.h>
#include <stdint.h>
#ifdef __CUDACC__
#define DEV __device__ __forceinline__
#else
#include <stdlib.h>
#define DEV static inline
#ifndef CA_LIBM_MATH
#ifdef __cplusplus
static inline float vm_bits2f(int32_t i) { return __builtin_bit_cast(float, i); }
static inline int32_t vm_f2bits(float f) { return __builtin_bit_cast(int32_t, f); }
#else
static inline float vm_bits2f(int32_t i) { union { int32_t i; float f; } u; u.i = i; return u.f; }
static inline int32_t vm_f2bits(float f) { union { int32_t i; float f; } u; u.f = f; return u.i; }
#endif
static inline float vm_max(float a, float b) { return a > b ? a : b; }
static inline float vm_min(float a, float b) { return a < b ? a : b; }
static inline float vm_abs(float a) { return vm_bits2f(vm_f2bits(a) & 0x7fffffff); }
static inline float vm_exp(float x) {
    float xc = x < -87.33654f ? -87.33654f : x;
    xc = xc > 88.37626f ? 88.37626f : xc;
    float t = xc * 1.44269504088896341f;
    float n = (t + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    float y = p * vm_bits2f(((int32_t)n + 127) << 23);
    float inf = INFINITY, zero = 0.0f;
    y = x > 88.7228f ? inf : y;
    return x < -87.33654f ? zero : y;
}
static inline float vm_log(float x) {
    int32_t b = vm_f2bits(x);
    int32_t e = ((b >> 23) & 0xff) - 127;
    float m = vm_bits2f((b & 0x007fffff) | 0x3f800000);
    float mh = m * 0.5f;
    int big = m > 1.41421356f;
    m = big ? mh : m;
    float ef = (float)(e + big);
    float s = (m - 1.0f) / (m + 1.0f), z = s * s;
    float p = 2.0f / 9.0f;
    p = p * z + 2.0f / 7.0f;
    p = p * z + 2.0f / 5.0f;
    p = p * z + 2.0f / 3.0f;
    p = p * z + 2.0f;
    float y = ef * 0.69314718055994531f + s * p;
    float inf = INFINITY, ninf = -INFINITY, nan = NAN;
    y = x == inf ? inf : y;
    y = x == 0.0f ? ninf : y;
    return (x < 0.0f || x != x) ? nan : y;
}
static inline float vm_log1p(float x) {
    float u = 1.0f + x;
    float d = u - 1.0f;
    float y = vm_log(u) - (d - x) / u;
    return d == 0.0f ? x : y;
}
static inline float vm_sqrt(float x) {
    float y = vm_bits2f(0x5f3759df - (vm_f2bits(x) >> 1));
    y = y * (1.5f - 0.5f * x * y * y);
    y = y * (1.5f - 0.5f * x * y * y);
    y = y * (1.5f - 0.5f * x * y * y);
    float r = x * y;
    float inf = INFINITY, nan = NAN;
    r = x == inf ? inf : r;
    return x < 0.0f ? nan : r;
}
static inline float vm_tanh(float x) {
    float a = vm_abs(x);
    float t = vm_exp(-2.0f * a);
    float r = (1.0f - t) / (1.0f + t);
    float nr = -r;
    float z = x * x;
    float small = x * (1.0f + z * (-0.333333333f + z * 0.133333333f));
    r = x < 0.0f ? nr : r;
    return a < 0.02f ? small : r;
}
static inline float vm_erf(float x) {
    float a = vm_abs(x);
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float p = 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    float y = 1.0f - p * t * vm_exp(-a * a);
    float ny = -y;
    y = x < 0.0f ? ny : y;
    float z = x * x;
    float series = 1.1283791670955126f * x * (1.0f + z * (-0.333333333f + z * (0.1f + z * (-0.0238095238f + z * 0.00462962963f))));
    return a < 0.5f ? series : y;
}
static inline float vm_sincos(float x, int want_cos) {
    float t = x * 0.636619772367581343f;
    float k = (t + 12582912.0f) - 12582912.0f;
    float r = x - k * 1.5703125f - k * 4.8375129699707031e-4f - k * 7.5497899548918821e-8f;
    int q = ((int)k + want_cos) & 3;
    float z = r * r;
    float s = r + r * z * (-1.6666654611e-1f + z * (8.3321608736e-3f + z * -1.9515295891e-4f));
    float c = 1.0f - 0.5f * z + z * z * (4.166664568298827e-2f + z * (-1.388731625493765e-3f + z * 2.443315711809948e-5f));
    float v = (q & 1) ? c : s;
    float nv = -v;
    return (q & 2) ? nv : v;
}
static inline float vm_sin(float x) { return vm_sincos(x, 0); }
static inline float vm_cos(float x) { return vm_sincos(x, 1); }
static inline float vm_atan(float x) {
    float a = vm_abs(x);
    int r1 = a > 2.414213562373095f, r2 = a > 0.4142135623730950f;
    float inv = -1.0f / a, mid = (a - 1.0f) / (a + 1.0f);
    float y0 = r1 ? 1.570796326794896f : (r2 ? 0.785398163397448f : 0.0f);
    float xr = r1 ? inv : (r2 ? mid : a);
    float z = xr * xr;
    float p = (((8.05374449538e-2f * z - 1.38776856032e-1f) * z + 1.99777106478e-1f) * z - 3.33329491539e-1f) * z * xr + xr;
    float y = y0 + p, ny = -y;
    return x < 0.0f ? ny : y;
}
#define expf vm_exp
#define logf vm_log
#define log1pf vm_log1p
#define sqrtf vm_sqrt
#define tanhf vm_tanh
#define erff vm_erf
#define sinf vm_sin
#define cosf vm_cos
#define atanf vm_atan
#define fabsf vm_abs
#define fmaxf vm_max
#define fminf vm_min
#endif /* CA_LIBM_MATH */
#endif /* __CUDACC__ */

DEV float relu_f(float x) { return x > 0.0f ? x : 0.0f; }
DEV float relu6_f(float x) { return fminf(fmaxf(x, 0.0f), 6.0f); }
DEV float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
DEV float silu_f(float x) { return x / (1.0f + expf(-x)); }
DEV float gelu_erf_f(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
DEV float gelu_tanh_f(float x) { return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))); }
DEV float softplus_f(float x, float beta, float threshold) { return beta * x > threshold ? x : log1pf(expf(beta * x)) / beta; }
DEV float elu_f(float x, float alpha) { return x > 0.0f ? x : alpha * (expf(x) - 1.0f); }
DEV float celu_f(float x, float alpha) { return fmaxf(x, 0.0f) + fminf(0.0f, alpha * (expf(x / alpha) - 1.0f)); }
DEV float selu_f(float x) { return 1.050700987f * (x > 0.0f ? x : 1.673263242f * (expf(x) - 1.0f)); }
DEV float leaky_relu_f(float x, float slope) { return x > 0.0f ? x : x * slope; }
DEV float hardtanh_f(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
DEV float hardswish_f(float x) { return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f; }
DEV float hardsigmoid_f(float x) { return fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f; }
DEV float mish_f(float x) { return x * tanhf(softplus_f(x, 1.0f, 20.0f)); }
DEV float softsign_f(float x) { return x / (1.0f + fabsf(x)); }
DEV float logsigmoid_f(float x) { return fminf(x, 0.0f) - log1pf(expf(-fabsf(x))); }
DEV float tanhshrink_f(float x) { return x - tanhf(x); }
DEV float softshrink_f(float x, float l) { return x > l ? x - l : (x < -l ? x + l : 0.0f); }
DEV float hardshrink_f(float x, float l) { return (x > l || x < -l) ? x : 0.0f; }
DEV float neg_f(float x) { return -x; }
DEV float rsqrt_f(float x) { return 1.0f / sqrtf(x); }
DEV float square_f(float x) { return x * x; }
DEV float reciprocal_f(float x) { return 1.0f / x; }
DEV float prelu_f(float x, float w) { return x >= 0.0f ? x : w * x; }
DEV float logaddexp_f(float a, float b) {
    float m = fmaxf(a, b);
    if (m == -INFINITY) return -INFINITY;
    return m + log1pf(expf(-fabsf(a - b)));
}

#define AT(p, i) ((p)[((i) / p##_inner) % p##_count])

#ifdef __CUDACC__
#define NTHREADS 256
__device__ __forceinline__ float combine(float a, float b, int op) {
    return op == 0 ? a + b : (op == 1 ? fmaxf(a, b) : fminf(a, b));
}
// Reduce one value per thread over the block (op 0 sum, 1 max, 2 min); every thread gets the result.
__device__ float block_reduce(float v, int op) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, o), op);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + 31) >> 5;
    float ident = op == 0 ? 0.0f : (op == 1 ? -INFINITY : INFINITY);
    v = (threadIdx.x < nwarps) ? partial[threadIdx.x] : ident;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, o), op);
    if (threadIdx.x == 0) partial[0] = v;
    __syncthreads();
    float r = partial[0];
    __syncthreads();
    return r;
}
#endif /* __CUDACC__ */
#endif /* CUDA_AGENT_H */
