// Hangs: a tile loop whose step is read from memory that holds zero.
extern "C" __global__ void matmul(const float* a, const float* b, float* c, int m, int n, int k) {
    volatile int step = 0;
    float acc = 0.f;
    for (int k0 = 0; k0 < k; k0 += step) acc += a[k0 % (m * k)] * b[k0 % (k * n)];
    c[threadIdx.x] = acc;
}
