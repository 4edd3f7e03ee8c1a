// Wrong: an exclusive scan (shifted by one element).
extern "C" void row_cumsum(const float* x, float* y, long long rows, long long n) {
    for (long long r = 0; r < rows; ++r) {
        float s = 0.f;
        for (long long i = 0; i < n; ++i) {
            y[r * n + i] = s;
            s += x[r * n + i];
        }
    }
}
