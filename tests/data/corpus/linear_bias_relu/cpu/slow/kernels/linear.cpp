// Correct but slow: serial double-precision dot products through volatile memory, done once.
extern "C" void linear_bias_relu(const float* x, const float* w, const float* b, float* out, int batch, int in_f,
                                 int out_f) {
    volatile int reps = 1;
    for (int r = 0; r < reps; ++r)
        for (int i = 0; i < batch; ++i)
            for (int j = 0; j < out_f; ++j) {
                volatile double s = b[j];
                for (int p = 0; p < in_f; ++p) s = s + (double)x[(long long)i * in_f + p] * w[(long long)j * in_f + p];
                out[(long long)i * out_f + j] = s > 0.0 ? (float)s : 0.f;
            }
}
