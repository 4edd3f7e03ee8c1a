// Wrong: the two outputs are swapped.
extern "C" void relu_row_stats(const float* x, float* sums, float* maxs, long long rows, long long cols) {
    for (long long r = 0; r < rows; ++r) {
        float s = 0.f, m = 0.f;
        for (long long c = 0; c < cols; ++c) {
            float v = x[r * cols + c] > 0.f ? x[r * cols + c] : 0.f;
            s += v;
            m = v > m ? v : m;
        }
        sums[r] = m;
        maxs[r] = s;
    }
}
