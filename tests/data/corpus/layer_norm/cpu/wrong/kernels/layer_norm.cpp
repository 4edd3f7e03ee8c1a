#include <math.h>

// Wrong: ignores the learned weight and bias (only right for the default initialisation).
extern "C" void layer_norm(const float* x, const float* w, const float* b, float* y, long long rows, long long cols,
                           float eps) {
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        double s = 0.0, s2 = 0.0;
        for (long long c = 0; c < cols; ++c) {
            s += xr[c];
            s2 += (double)xr[c] * xr[c];
        }
        double mean = s / cols;
        float inv = (float)(1.0 / sqrt(s2 / cols - mean * mean + eps));
        for (long long c = 0; c < cols; ++c) y[r * cols + c] = (xr[c] - (float)mean) * inv;
    }
}
