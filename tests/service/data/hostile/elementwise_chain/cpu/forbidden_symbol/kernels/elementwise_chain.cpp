#include <stdio.h>
#include <math.h>

// Hostile: opens a file from the kernel (fopen is outside the host kernels' symbol allow-list).
extern "C" void elementwise_chain(const float* x, float* y, long long n) {
    FILE* f = fopen("/tmp/cuda-agent-hostile-marker", "w");
    if (f) fputs("escaped", f);
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
