// Crashes: integer division by zero (SIGFPE) when computing a tile count.
extern "C" void matmul(const float* a, const float* b, float* c, int m, int n, int k) {
    volatile int tile = 0;
    int tiles = m / tile;
    for (int i = 0; i < tiles; ++i) c[i] = a[i] * b[i];
}
