// Correct but slow: only thread 0 of each block works, and it recomputes each element 16 times.
extern "C" __global__ void elementwise_chain(const float* x, float* y, long long n) {
    if (threadIdx.x != 0) return;
    for (long long i = blockIdx.x; i < n; i += gridDim.x) {
        float v = 0.f;
        for (int r = 0; r < 16; ++r) {
            float xi = x[i];
            float t = fmaxf(xi * 1.5f + 0.5f, 0.f);
            t = fminf(t - xi * 0.25f, 4.f);
            v = (t * t + 1.f) / (1.f + fabsf(xi));
        }
        y[i] = v;
    }
}
