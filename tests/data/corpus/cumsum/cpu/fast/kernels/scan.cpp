// One sequential scan per row (rows in parallel); the running sum is kept in double.
extern "C" void row_cumsum(const float* x, float* y, long long rows, long long n) {
#pragma omp parallel for
    for (long long r = 0; r < rows; ++r) {
        double s = 0.0;
        const float* xr = x + r * n;
        float* yr = y + r * n;
        for (long long i = 0; i < n; ++i) {
            s += xr[i];
            yr[i] = (float)s;
        }
    }
}
