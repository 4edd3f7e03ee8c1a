// One block per row, float4 loads when the row allows, one block reduction.
__device__ float block_sum(float v) {
    __shared__ float warp_vals[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    v = lane < ((blockDim.x + 31) >> 5) ? warp_vals[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

extern "C" __global__ void mean_of_squares(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    const float* xr = x + (long long)blockIdx.x * cols;
    float s = 0.f;
    if ((cols & 3) == 0 && ((unsigned long long)xr & 15) == 0) {
        const float4* x4 = (const float4*)xr;
        for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
            float4 v = x4[c];
            s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c] * xr[c];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) out[blockIdx.x] = s / cols;
}
