// One block per row: each thread scans a contiguous chunk, a block-wide exclusive scan of the chunk totals
// (Hillis-Steele in shared memory) gives each chunk its offset, then the chunk is written with the offset added.
extern "C" __global__ void row_cumsum(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    __shared__ float totals[1024];
    const float* xr = x + (long long)blockIdx.x * n;
    float* yr = y + (long long)blockIdx.x * n;
    int chunk = (n + blockDim.x - 1) / blockDim.x;
    int lo = threadIdx.x * chunk, hi = min(lo + chunk, n);
    float s = 0.f;
    for (int i = lo; i < hi; ++i) s += xr[i];
    totals[threadIdx.x] = s;
    __syncthreads();
    for (int off = 1; off < blockDim.x; off <<= 1) {
        float v = threadIdx.x >= off ? totals[threadIdx.x - off] : 0.f;
        __syncthreads();
        totals[threadIdx.x] += v;
        __syncthreads();
    }
    float run = totals[threadIdx.x] - s;  // exclusive prefix of this chunk
    for (int i = lo; i < hi; ++i) {
        run += xr[i];
        yr[i] = run;
    }
}
