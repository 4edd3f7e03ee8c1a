// Hangs: spins forever on a volatile flag (the sandbox must kill it at the trial time limit).
extern "C" void elementwise_chain(const float* x, float* y, long long n) {
    volatile int spin = 1;
    while (spin) {
    }
    for (long long i = 0; i < n; ++i) y[i] = x[i];
}
