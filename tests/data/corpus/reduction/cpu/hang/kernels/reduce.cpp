// Hangs: the loop counter is unsigned and the condition can never fail.
extern "C" void mean_of_squares(const float* x, float* out, long long rows, long long cols) {
    volatile float s = 0.f;
    for (volatile unsigned int i = 0; i < 4294967295u || true; ++i) s = s + x[i % (unsigned)cols];
    out[0] = s;
}
