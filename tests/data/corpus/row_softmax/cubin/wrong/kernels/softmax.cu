// Wrong: each thread normalises by its own partial sum instead of the row's.
extern "C" __global__ void row_softmax(const float* x, float* y, int rows, int cols) {
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;
    float m = -INFINITY, s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) / s;
}
