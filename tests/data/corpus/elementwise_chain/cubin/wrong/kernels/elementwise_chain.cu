// Wrong: the clamp is missing.
extern "C" __global__ void elementwise_chain(const float* x, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float xi = x[i];
        float v = fmaxf(xi * 1.5f + 0.5f, 0.f) - xi * 0.25f;
        v = v * v + 1.f;
        y[i] = v / (1.f + fabsf(xi));
    }
}
