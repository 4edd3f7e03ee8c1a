// Hangs: block 0 waits for a signal from a block that is waiting for block 0.
extern "C" __global__ void mean_of_squares(const float* x, float* out, int rows, int cols) {
    volatile float* flag = out;
    if (threadIdx.x == 0) {
        while (flag[(blockIdx.x + 1) % rows] != 12345.f) {
        }
        out[blockIdx.x] = 12345.f + x[0] * 0.f;
    }
}
