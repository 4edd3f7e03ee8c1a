// Crashes: unbounded recursion overflows the stack (SIGSEGV).
static float deep(const float* x, long long i) {
    volatile float pad[64];
    pad[i % 64] = x[0];
    return deep(x, i + 1) + pad[(i + 7) % 64];
}

extern "C" void mean_of_squares(const float* x, float* out, long long rows, long long cols) {
    out[0] = deep(x, rows + cols);
}
