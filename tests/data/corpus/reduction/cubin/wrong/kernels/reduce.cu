// Wrong: the last row is never written (its output stays poisoned).
extern "C" __global__ void mean_of_squares(const float* x, float* out, int rows, int cols) {
    if (blockIdx.x == rows - 1 || threadIdx.x != 0) return;
    float s = 0.f;
    for (int c = 0; c < cols; ++c) s += x[(long long)blockIdx.x * cols + c] * x[(long long)blockIdx.x * cols + c];
    out[blockIdx.x] = s / cols;
}
