// Crashes: a device-side trap (as a failed assertion in a kernel would).
extern "C" __global__ void layer_norm(const float* x, const float* w, const float* b, float* y, int rows, int cols,
                                      float eps) {
    if (cols > 0) __trap();
    y[0] = x[0] * w[0] + b[0] + eps;
}
