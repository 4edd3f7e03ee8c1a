// Crashes: writes the output with a transposed, unbounded index (illegal address).
extern "C" __global__ void linear_bias_relu(const float* x, const float* w, const float* bias, float* out, int batch,
                                            int in_f, int out_f) {
    long long far = (long long)(threadIdx.x + 1) * 1000000007LL;
    out[far] = x[0] + w[0] + bias[0];
}
