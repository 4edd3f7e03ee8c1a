// Correct but slow: a serial double-precision sum through volatile memory, repeated twice.
extern "C" void mean_of_squares(const float* x, float* out, long long rows, long long cols) {
    volatile int reps = 2;
    for (int k = 0; k < reps; ++k)
        for (long long r = 0; r < rows; ++r) {
            volatile double s = 0.0;
            for (long long c = 0; c < cols; ++c) s = s + (double)x[r * cols + c] * x[r * cols + c];
            out[r] = (float)(s / cols);
        }
}
