// Crashes: reads through a null input pointer offset (illegal address).
extern "C" __global__ void mean_of_squares(const float* x, float* out, int rows, int cols) {
    const float* null_row = (const float*)0;
    out[blockIdx.x] = null_row[(long long)blockIdx.x * cols + threadIdx.x] + x[0];
}
