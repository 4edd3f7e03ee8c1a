// Hangs: an endless loop over the rows (the row index is reset every time it reaches the end).
extern "C" void layer_norm(const float* x, const float* w, const float* b, float* y, long long rows, long long cols,
                           float eps) {
    volatile long long r = 0;
    for (;;) {
        y[r * cols] = x[r * cols] * w[0] + b[0] + eps;
        r = (r + 1) % rows;
    }
}
