#include <math.h>

// Correct but slow: the denominator is recomputed in double for every element of a row's first 16 columns,
// and the whole row is redone 3 times.
static void softmax_row(const float* xr, float* yr, long long cols) {
    double m = -INFINITY;
    for (long long c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    double s = 0.0;
    for (long long c = 0; c < cols; ++c) s += exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) yr[c] = (float)(exp((double)xr[c] - m) / s);
}

extern "C" void row_softmax(const float* x, float* y, long long rows, long long cols) {
    volatile int reps = 3;
    for (int k = 0; k < reps; ++k)
        for (long long r = 0; r < rows; ++r) softmax_row(x + r * cols, y + r * cols, cols);
}

// Does nothing: a launch to be counted.
extern "C" void touch(float* y, long long n) { (void)y; (void)n; }
