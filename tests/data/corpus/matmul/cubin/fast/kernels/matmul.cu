// 16x16 shared-memory tiles of A and B; each thread accumulates one element of C.
#define TILE 16

extern "C" __global__ void matmul(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                  int m, int n, int k) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int k0 = 0; k0 < k; k0 += TILE) {
        as[threadIdx.y][threadIdx.x] = (row < m && k0 + threadIdx.x < k) ? a[(long long)row * k + k0 + threadIdx.x] : 0.f;
        bs[threadIdx.y][threadIdx.x] = (col < n && k0 + threadIdx.y < k) ? b[(long long)(k0 + threadIdx.y) * n + col] : 0.f;
        __syncthreads();
#pragma unroll
        for (int p = 0; p < TILE; ++p) acc += as[threadIdx.y][p] * bs[p][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) c[(long long)row * n + col] = acc;
}
