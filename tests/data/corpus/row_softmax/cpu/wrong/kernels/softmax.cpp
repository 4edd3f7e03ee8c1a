#include <math.h>

// Wrong: the normaliser is off by one (divides by sum + 1).
extern "C" void row_softmax(const float* x, float* y, long long rows, long long cols) {
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = -INFINITY;
        for (long long c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        float s = 0.f;
        for (long long c = 0; c < cols; ++c) s += expf(xr[c] - m);
        for (long long c = 0; c < cols; ++c) yr[c] = expf(xr[c] - m) / (s + 1.f);
    }
}
