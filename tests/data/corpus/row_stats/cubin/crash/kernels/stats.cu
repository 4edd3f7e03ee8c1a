// Crashes: follows a pointer stored in the input data (illegal address).
extern "C" __global__ void relu_row_stats(const float* x, float* sums, float* maxs, int rows, int cols) {
    float** table = (float**)0xdeadbeef000ULL;
    sums[blockIdx.x] = table[blockIdx.x][threadIdx.x];
    maxs[blockIdx.x] = x[0];
}
