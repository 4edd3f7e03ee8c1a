#include <stdlib.h>

// Crashes: aborts (SIGABRT), as a failed assertion in a kernel would.
extern "C" void layer_norm(const float* x, const float* w, const float* b, float* y, long long rows, long long cols,
                           float eps) {
    if (rows > 0) abort();
    y[0] = x[0] * w[0] + b[0] + eps;
}
