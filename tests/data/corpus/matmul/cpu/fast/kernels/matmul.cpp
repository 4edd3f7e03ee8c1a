// i-k-j order with blocking over k: the inner loop streams a row of B and a row of C (vectorises).
extern "C" void matmul(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int m, int n,
                       int k) {
    const int KB = 64;
#pragma omp parallel for
    for (int i = 0; i < m; ++i) {
        float* ci = c + (long long)i * n;
        for (int j = 0; j < n; ++j) ci[j] = 0.f;
        for (int k0 = 0; k0 < k; k0 += KB) {
            int k1 = k0 + KB < k ? k0 + KB : k;
            for (int p = k0; p < k1; ++p) {
                float aip = a[(long long)i * k + p];
                const float* bp = b + (long long)p * n;
                for (int j = 0; j < n; ++j) ci[j] += aip * bp[j];
            }
        }
    }
}
