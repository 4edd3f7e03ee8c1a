// Wrong: leaves the last row unwritten (it stays poisoned).
extern "C" void mean_of_squares(const float* x, float* out, long long rows, long long cols) {
    for (long long r = 0; r + 1 < rows; ++r) {
        float s = 0.f;
        for (long long c = 0; c < cols; ++c) s += x[r * cols + c] * x[r * cols + c];
        out[r] = s / (float)cols;
    }
}
