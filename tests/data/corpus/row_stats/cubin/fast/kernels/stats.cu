// One block per row computes both outputs in one sweep (two block reductions on the same data).
__device__ void block_sum_max(float& s, float& m) {
    __shared__ float ss[32], ms[32];
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffff, s, o);
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0) {
        ss[warp] = s;
        ms[warp] = m;
    }
    __syncthreads();
    s = lane < nw ? ss[lane] : 0.f;
    m = lane < nw ? ms[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffff, s, o);
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    }
}

extern "C" __global__ void relu_row_stats(const float* __restrict__ x, float* __restrict__ sums,
                                          float* __restrict__ maxs, int rows, int cols) {
    const float* xr = x + (long long)blockIdx.x * cols;
    float s = 0.f, m = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = fmaxf(xr[c], 0.f);
        s += v;
        m = fmaxf(m, v);
    }
    block_sum_max(s, m);
    if (threadIdx.x == 0) {
        sums[blockIdx.x] = s;
        maxs[blockIdx.x] = m;
    }
}
