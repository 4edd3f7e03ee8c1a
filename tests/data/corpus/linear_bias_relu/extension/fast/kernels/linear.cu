#include <cuda_runtime.h>
#define TILE 16

__global__ void linear_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                   const float* __restrict__ bias, float* __restrict__ out, int batch, int in_f,
                                   int out_f) {
    __shared__ float xs[TILE][TILE];
    __shared__ float ws[TILE][TILE + 1];
    int i = blockIdx.y * TILE + threadIdx.y, j = blockIdx.x * TILE + threadIdx.x, wj = blockIdx.x * TILE + threadIdx.y;
    float acc = 0.f;
    for (int k0 = 0; k0 < in_f; k0 += TILE) {
        xs[threadIdx.y][threadIdx.x] = (i < batch && k0 + threadIdx.x < in_f) ? x[(long long)i * in_f + k0 + threadIdx.x] : 0.f;
        ws[threadIdx.y][threadIdx.x] = (wj < out_f && k0 + threadIdx.x < in_f) ? w[(long long)wj * in_f + k0 + threadIdx.x] : 0.f;
        __syncthreads();
        for (int p = 0; p < TILE; ++p) acc += xs[threadIdx.y][p] * ws[threadIdx.x][p];
        __syncthreads();
    }
    if (i < batch && j < out_f) out[(long long)i * out_f + j] = fmaxf(acc + bias[j], 0.f);
}

void linear_relu_launch(const float* x, const float* w, const float* b, float* out, int batch, int in_f, int out_f,
                        cudaStream_t stream) {
    dim3 grid((out_f + TILE - 1) / TILE, (batch + TILE - 1) / TILE), block(TILE, TILE);
    linear_relu_kernel<<<grid, block, 0, stream>>>(x, w, b, out, batch, in_f, out_f);
}
