// Hangs: waits forever for a flag nobody sets.
extern "C" void row_softmax(const float* x, float* y, long long rows, long long cols) {
    volatile int ready = 0;
    while (!ready) {
    }
    y[0] = x[0];
}
