// Correct but slow: thread 0 of each block does the whole row serially.
extern "C" __global__ void row_softmax(const float* x, float* y, int rows, int cols) {
    if (threadIdx.x != 0) return;
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
    float s = 0.f;
    for (int c = 0; c < cols; ++c) s += expf(xr[c] - m);
    for (int c = 0; c < cols; ++c) yr[c] = expf(xr[c] - m) / s;
}
