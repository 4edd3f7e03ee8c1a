// elementwise_chain, made compute-heavy on purpose (reps dependent FMAs by one and zero: the same result bit for
// bit), so that the kernel runs for tens of microseconds: what an honest solution pays on every timed call.
#include <cuda_runtime.h>

__global__ void heavy_chain_kernel(const float* __restrict__ x, float* __restrict__ y, long long n, int reps,
                                   float one, float zero) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float xi = x[i];
        float v = fminf(fmaxf(xi * 1.5f + 0.5f, 0.f) - xi * 0.25f, 4.f);
        for (int r = 0; r < reps; ++r) v = fmaf(v, one, zero);
        y[i] = (v * v + 1.f) / (1.f + fabsf(xi));
    }
}

void heavy_chain_launch(const float* x, float* y, long long n, int reps, cudaStream_t stream) {
    long long blocks = (n + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    heavy_chain_kernel<<<(unsigned)blocks, 256, 0, stream>>>(x, y, n, reps, 1.0f, 0.0f);
}
