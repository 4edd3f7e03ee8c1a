#include <math.h>

// Wrong: the clamp is missing, so large inputs come out too big.
extern "C" void elementwise_chain(const float* x, float* y, long long n) {
    for (long long i = 0; i < n; ++i) {
        float xi = x[i];
        float v = xi * 1.5f + 0.5f;
        v = v > 0.f ? v : 0.f;
        v = v - xi * 0.25f;
        v = v * v + 1.f;
        y[i] = v / (1.f + fabsf(xi));
    }
}
