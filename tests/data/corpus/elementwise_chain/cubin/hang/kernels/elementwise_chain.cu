// Hangs: every thread spins on a flag that no thread ever clears.
extern "C" __global__ void elementwise_chain(const float* x, float* y, long long n) {
    volatile int spin = 1;
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    while (spin) {
        if (i < n) y[i] = x[i];
    }
}
