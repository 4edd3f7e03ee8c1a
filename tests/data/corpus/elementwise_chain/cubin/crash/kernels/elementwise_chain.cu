// Crashes: writes through a wild device pointer (illegal address, a sticky CUDA error).
extern "C" __global__ void elementwise_chain(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    float* wild = (float*)0x100;
    if (i < n) wild[i * 1024] = x[i];
}
