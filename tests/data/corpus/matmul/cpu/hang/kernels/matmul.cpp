// Hangs: a tile loop whose step is zero.
extern "C" void matmul(const float* a, const float* b, float* c, int m, int n, int k) {
    volatile int step = 0;
    for (int i = 0; i < m; i += step) c[i % (m * n)] = a[i % (m * k)] + b[i % (k * n)];
}
