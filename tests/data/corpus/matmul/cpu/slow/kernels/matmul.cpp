// Correct but slow: i-j-k order (B read down its columns) with a double accumulator.
extern "C" void matmul(const float* a, const float* b, float* c, int m, int n, int k) {
    volatile int reps = 1;
    for (int r = 0; r < reps; ++r)
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
                volatile double s = 0.0;
                for (int p = 0; p < k; ++p) s = s + (double)a[(long long)i * k + p] * b[(long long)p * n + j];
                c[(long long)i * n + j] = (float)s;
            }
}
