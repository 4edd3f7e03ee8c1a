// Crashes: dereferences a pointer read from uninitialised-looking data (SIGSEGV).
extern "C" void relu_row_stats(const float* x, float* sums, float* maxs, long long rows, long long cols) {
    volatile unsigned long long addr = 0xdeadbeef000ULL;
    float** table = (float**)addr;
    sums[0] = table[rows][cols];
    maxs[0] = x[0];
}
