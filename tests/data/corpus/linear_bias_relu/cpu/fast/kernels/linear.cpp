// out[i, j] = max(0, b[j] + dot(x[i, :], w[j, :])): both operands are read along contiguous rows.
extern "C" void linear_bias_relu(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                                 float* __restrict__ out, int batch, int in_f, int out_f) {
#pragma omp parallel for
    for (int i = 0; i < batch; ++i) {
        const float* xi = x + (long long)i * in_f;
        for (int j = 0; j < out_f; ++j) {
            const float* wj = w + (long long)j * in_f;
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int p = 0;
            for (; p + 8 <= in_f; p += 8)
                for (int q = 0; q < 8; ++q) acc[q] += xi[p + q] * wj[p + q];
            float s = b[j];
            for (int q = 0; q < 8; ++q) s += acc[q];
            for (; p < in_f; ++p) s += xi[p] * wj[p];
            out[(long long)i * out_f + j] = s > 0.f ? s : 0.f;
        }
    }
}
