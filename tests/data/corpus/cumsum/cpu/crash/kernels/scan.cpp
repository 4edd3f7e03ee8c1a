// Crashes: writes through a wild pointer computed from a corrupted row stride (SIGSEGV).
extern "C" void row_cumsum(const float* x, float* y, long long rows, long long n) {
    volatile long long stride = 1LL << 40;
    for (long long r = 0; r < rows; ++r) y[r * stride] = x[r * n];
}
