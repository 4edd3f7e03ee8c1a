// Hangs: restarts the scan whenever the running sum is negative, which with these inputs is forever.
extern "C" void row_cumsum(const float* x, float* y, long long rows, long long n) {
    volatile double s = -1.0;
    while (s < 0.0) {
        s = -1.0;
        for (long long i = 0; i < n; ++i) y[i] = (float)s;
    }
}
