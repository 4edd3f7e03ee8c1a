// Hangs: waits for a maximum that can never be reached.
extern "C" void relu_row_stats(const float* x, float* sums, float* maxs, long long rows, long long cols) {
    volatile float m = 0.f;
    while (m < 1e30f) {
        m = m > 1e20f ? 0.f : m + x[0] * 0.f;
    }
    sums[0] = maxs[0] = m + rows + cols;
}
