// Hangs: waits for a running maximum that can never be reached.
extern "C" __global__ void relu_row_stats(const float* x, float* sums, float* maxs, int rows, int cols) {
    volatile float m = 0.f;
    while (m < 1e30f) {
        m = m > 1e20f ? 0.f : m + x[0] * 0.f;
    }
    sums[blockIdx.x] = maxs[blockIdx.x] = m;
}
