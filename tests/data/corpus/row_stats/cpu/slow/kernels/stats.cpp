// Correct but slow: two separate serial passes through volatile accumulators, repeated twice.
extern "C" void relu_row_stats(const float* x, float* sums, float* maxs, long long rows, long long cols) {
    volatile int reps = 2;
    for (int k = 0; k < reps; ++k)
        for (long long r = 0; r < rows; ++r) {
            volatile double s = 0.0;
            for (long long c = 0; c < cols; ++c) s = s + (x[r * cols + c] > 0.f ? x[r * cols + c] : 0.f);
            volatile float m = 0.f;
            for (long long c = 0; c < cols; ++c) m = x[r * cols + c] > m ? x[r * cols + c] : m;
            sums[r] = (float)s;
            maxs[r] = m;
        }
}
