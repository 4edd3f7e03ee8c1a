// Wrong: computes A @ B with B read transposed (right only for square symmetric B).
extern "C" void matmul(const float* a, const float* b, float* c, int m, int n, int k) {
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
            float s = 0.f;
            for (int p = 0; p < k; ++p) s += a[(long long)i * k + p] * b[((long long)j * k + p) % ((long long)k * n)];
            c[(long long)i * n + j] = s;
        }
}
