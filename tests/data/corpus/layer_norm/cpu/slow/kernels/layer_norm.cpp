#include <math.h>

// Correct but slow: three separate passes in double, the whole thing repeated 4 times.
extern "C" void layer_norm(const float* x, const float* w, const float* b, float* y, long long rows, long long cols,
                           float eps) {
    volatile int reps = 4;
    for (int k = 0; k < reps; ++k) {
        for (long long r = 0; r < rows; ++r) {
            const float* xr = x + r * cols;
            double mean = 0.0;
            for (long long c = 0; c < cols; ++c) mean += xr[c];
            mean /= cols;
            double var = 0.0;
            for (long long c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
            var /= cols;
            for (long long c = 0; c < cols; ++c) y[r * cols + c] = (float)((xr[c] - mean) / sqrt(var + eps) * w[c] + b[c]);
        }
    }
}
