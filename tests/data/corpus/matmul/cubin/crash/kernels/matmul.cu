// Crashes: misaligned vector load (misaligned address, a sticky CUDA error).
extern "C" __global__ void matmul(const float* a, const float* b, float* c, int m, int n, int k) {
    const float4* bad = (const float4*)((const char*)a + 4);
    float4 v = bad[threadIdx.x];
    c[threadIdx.x] = v.x + v.y + b[0];
}
