// One block per row: mean and mean of squares in one sweep (block reductions), then normalise and scale.
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

extern "C" __global__ void layer_norm(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ b, float* __restrict__ y, int rows, int cols,
                                      float eps) {
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;
    float s = 0.f, s2 = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = xr[c];
        s += v;
        s2 += v * v;
    }
    s = block_sum(s);
    s2 = block_sum(s2);
    float mean = s / cols;
    float inv = rsqrtf(fmaxf(s2 / cols - mean * mean, 0.f) + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = (xr[c] - mean) * inv * w[c] + b[c];
}
