// Crashes: indexes rows with a corrupted stride, far outside the allocation (illegal address).
extern "C" __global__ void row_softmax(const float* x, float* y, int rows, int cols) {
    long long stride = (long long)cols << 24;
    y[blockIdx.x * stride + threadIdx.x] = x[threadIdx.x];
}
