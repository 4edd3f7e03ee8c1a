#include <stdlib.h>

// Crashes: frees memory it does not own (glibc aborts the process).
extern "C" void linear_bias_relu(const float* x, const float* w, const float* b, float* out, int batch, int in_f,
                                 int out_f) {
    free((void*)(out + 3));
    out[0] = x[0] + w[0] + b[0] + batch + in_f + out_f;
}
