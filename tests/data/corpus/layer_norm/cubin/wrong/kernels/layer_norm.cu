// Wrong: ignores the learned weight and bias.
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

extern "C" __global__ void layer_norm(const float* x, const float* w, const float* b, float* y, int rows, int cols,
                                      float eps) {
    const float* xr = x + (long long)blockIdx.x * cols;
    float s = 0.f, s2 = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        s += xr[c];
        s2 += xr[c] * xr[c];
    }
    s = block_sum(s);
    s2 = block_sum(s2);
    float mean = s / cols;
    float inv = rsqrtf(s2 / cols - mean * mean + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[(long long)blockIdx.x * cols + c] = (xr[c] - mean) * inv;
}
