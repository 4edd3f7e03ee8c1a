// Crashes: writes through a null pointer (SIGSEGV in the candidate worker).
extern "C" void elementwise_chain(const float* x, float* y, long long n) {
    volatile float* bad = (volatile float*)0;
    for (long long i = 0; i < n; ++i) {
        bad[i] = x[i];
        y[i] = x[i];
    }
}
