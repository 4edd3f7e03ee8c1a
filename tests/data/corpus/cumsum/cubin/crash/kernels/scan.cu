// Crashes: the running sum is used as an index (illegal address).
extern "C" __global__ void row_cumsum(const float* x, float* y, int rows, int n) {
    long long idx = (long long)(x[threadIdx.x] * 1e12f);
    y[idx] = x[threadIdx.x];
}
