// Crashes: reads far past the end of the input (SIGSEGV).
extern "C" void row_softmax(const float* x, float* y, long long rows, long long cols) {
    volatile float acc = 0.f;
    for (long long i = 0;; i += 1 << 20) acc += x[i];
    y[0] = acc;
}
