// Hangs: threads wait at a hand-made barrier that only half of them ever reach.
extern "C" __global__ void row_softmax(const float* x, float* y, int rows, int cols) {
    __shared__ volatile int arrived;
    if (threadIdx.x == 0) arrived = 0;
    __syncthreads();
    if (threadIdx.x % 2 == 0) atomicAdd((int*)&arrived, 1);
    while (arrived < (int)blockDim.x) {
    }
    y[(long long)blockIdx.x * cols + threadIdx.x] = x[threadIdx.x];
}
