// Correct but slow: one thread per output element reading straight from global memory in double.
extern "C" __global__ void matmul(const float* a, const float* b, float* c, int m, int n, int k) {
    int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) return;
    double acc = 0.0;
    for (int p = 0; p < k; ++p) acc += (double)a[(long long)row * k + p] * b[(long long)p * n + col];
    c[(long long)row * n + col] = (float)acc;
}
