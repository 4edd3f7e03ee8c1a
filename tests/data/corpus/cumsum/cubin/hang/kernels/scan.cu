// Hangs: a decoupled look-back that waits for a predecessor flag nobody publishes.
extern "C" __global__ void row_cumsum(const float* x, float* y, int rows, int n) {
    volatile float* flags = y;
    if (threadIdx.x == 0) {
        while (flags[(long long)((blockIdx.x + 1) % rows) * n] != 1.0e30f) {
        }
    }
    __syncthreads();
    y[(long long)blockIdx.x * n + threadIdx.x] = x[threadIdx.x];
}
