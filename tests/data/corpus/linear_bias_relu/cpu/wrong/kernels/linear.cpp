// Wrong: forgets the bias.
extern "C" void linear_bias_relu(const float* x, const float* w, const float* b, float* out, int batch, int in_f,
                                 int out_f) {
    for (int i = 0; i < batch; ++i)
        for (int j = 0; j < out_f; ++j) {
            float s = 0.f;
            for (int p = 0; p < in_f; ++p) s += x[(long long)i * in_f + p] * w[(long long)j * in_f + p];
            out[(long long)i * out_f + j] = s > 0.f ? s : 0.f;
        }
}
