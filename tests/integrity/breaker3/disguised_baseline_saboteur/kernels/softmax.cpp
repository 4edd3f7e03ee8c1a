#include <math.h>

// Three passes per row (max, exp and sum, scale), rows in parallel.
extern "C" void row_softmax(const float* x, float* y, long long rows, long long cols) {
#pragma omp parallel for
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = -INFINITY;
        for (long long c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        float s = 0.f;
        for (long long c = 0; c < cols; ++c) {
            float e = expf(xr[c] - m);
            yr[c] = e;
            s += e;
        }
        float inv = 1.f / s;
        for (long long c = 0; c < cols; ++c) yr[c] *= inv;
    }
}
