// out = relu(x @ W^T + b), 16x16 tiles of x and W in shared memory, bias and ReLU fused into the store.
#define TILE 16

extern "C" __global__ void linear_bias_relu(const float* __restrict__ x, const float* __restrict__ w,
                                            const float* __restrict__ bias, float* __restrict__ out, int batch,
                                            int in_f, int out_f) {
    __shared__ float xs[TILE][TILE];
    __shared__ float ws[TILE][TILE + 1];
    int i = blockIdx.y * TILE + threadIdx.y;   // batch row
    int j = blockIdx.x * TILE + threadIdx.x;   // output feature
    int wj = blockIdx.x * TILE + threadIdx.y;  // W row this thread loads
    float acc = 0.f;
    for (int k0 = 0; k0 < in_f; k0 += TILE) {
        xs[threadIdx.y][threadIdx.x] = (i < batch && k0 + threadIdx.x < in_f) ? x[(long long)i * in_f + k0 + threadIdx.x] : 0.f;
        ws[threadIdx.y][threadIdx.x] = (wj < out_f && k0 + threadIdx.x < in_f) ? w[(long long)wj * in_f + k0 + threadIdx.x] : 0.f;
        __syncthreads();
#pragma unroll
        for (int p = 0; p < TILE; ++p) acc += xs[threadIdx.y][p] * ws[threadIdx.x][p];
        __syncthreads();
    }
    if (i < batch && j < out_f) out[(long long)i * out_f + j] = fmaxf(acc + bias[j], 0.f);
}
