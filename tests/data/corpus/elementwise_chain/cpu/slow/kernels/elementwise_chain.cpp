#include <math.h>

// Correct but slow: each element is recomputed 64 times through volatile memory (no vectorisation).
extern "C" void elementwise_chain(const float* x, float* y, long long n) {
    for (long long i = 0; i < n; ++i) {
        volatile float v = 0.f;
        for (int rep = 0; rep < 64; ++rep) {
            float xi = x[i];
            float t = xi * 1.5f + 0.5f;
            t = t > 0.f ? t : 0.f;
            t = t - xi * 0.25f;
            t = t < 4.f ? t : 4.f;
            t = t * t + 1.f;
            v = t / (1.f + fabsf(xi));
        }
        y[i] = v;
    }
}
