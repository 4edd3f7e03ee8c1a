// One block per row: block-wide max and sum with warp shuffles, then one scaled write.
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float warp_vals[32];
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffff, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + 31) >> 5;
    v = lane < nwarps ? warp_vals[lane] : (is_max ? -INFINITY : 0.f);
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffff, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    return v;
}

extern "C" __global__ void row_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    m = block_reduce(m, true);
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(xr[c] - m);
    s = block_reduce(s, false);
    float inv = 1.f / s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __expf(xr[c] - m) * inv;
}
