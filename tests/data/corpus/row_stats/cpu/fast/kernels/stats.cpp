// One pass per row computes both outputs; relu is applied on the fly (no temporary).
extern "C" void relu_row_stats(const float* x, float* sums, float* maxs, long long rows, long long cols) {
#pragma omp parallel for
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        long long c = 0;
        for (; c + 8 <= cols; c += 8)
            for (int k = 0; k < 8; ++k) {
                float v = xr[c + k] > 0.f ? xr[c + k] : 0.f;
                s[k] += v;
                m[k] = v > m[k] ? v : m[k];
            }
        float st = 0.f, mt = 0.f;
        for (int k = 0; k < 8; ++k) {
            st += s[k];
            mt = m[k] > mt ? m[k] : mt;
        }
        for (; c < cols; ++c) {
            float v = xr[c] > 0.f ? xr[c] : 0.f;
            st += v;
            mt = v > mt ? v : mt;
        }
        sums[r] = st;
        maxs[r] = mt;
    }
}
