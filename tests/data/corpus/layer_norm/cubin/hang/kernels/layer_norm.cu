// Hangs: loops over its row forever (the column index wraps around instead of stopping).
extern "C" __global__ void layer_norm(const float* x, const float* w, const float* b, float* y, int rows, int cols,
                                      float eps) {
    volatile int c = threadIdx.x;
    long long base = (long long)blockIdx.x * cols;
    for (;;) {
        y[base + c] = x[base + c] * w[c] + b[c] + eps;
        c = (c + blockDim.x) % cols;
    }
}
