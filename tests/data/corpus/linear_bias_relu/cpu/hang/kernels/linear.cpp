// Hangs: a spin-wait on a lock that is never released.
extern "C" void linear_bias_relu(const float* x, const float* w, const float* b, float* out, int batch, int in_f,
                                 int out_f) {
    volatile int locked = 1;
    while (locked) {
        out[0] = x[0];
    }
    out[1] = w[0] + b[0] + batch + in_f + out_f;
}
