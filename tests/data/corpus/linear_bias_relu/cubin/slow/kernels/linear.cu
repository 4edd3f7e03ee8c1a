// Correct but slow: one thread per output, dot product straight from global memory in double.
extern "C" __global__ void linear_bias_relu(const float* x, const float* w, const float* bias, float* out, int batch,
                                            int in_f, int out_f) {
    int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= batch || j >= out_f) return;
    double acc = bias[j];
    for (int p = 0; p < in_f; ++p) acc += (double)x[(long long)i * in_f + p] * w[(long long)j * in_f + p];
    out[(long long)i * out_f + j] = acc > 0.0 ? (float)acc : 0.f;
}
