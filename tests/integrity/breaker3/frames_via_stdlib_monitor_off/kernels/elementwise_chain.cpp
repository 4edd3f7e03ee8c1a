#include <math.h>

// One pass over memory: every intermediate stays in a register.
extern "C" void elementwise_chain(const float* __restrict__ x, float* __restrict__ y, long long n) {
#pragma omp simd
    for (long long i = 0; i < n; ++i) {
        float xi = x[i];
        float v = xi * 1.5f + 0.5f;
        v = v > 0.f ? v : 0.f;
        v = v - xi * 0.25f;
        v = v < 4.f ? v : 4.f;
        v = v * v + 1.f;
        y[i] = v / (1.f + fabsf(xi));
    }
}
