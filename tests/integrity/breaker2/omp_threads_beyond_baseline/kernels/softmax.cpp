#include <math.h>
#include <omp.h>

// The corpus's fast kernel on every core of the host (the baselines are held to SandboxConfig.cpu_threads), and
// the size of the team it got, written to team[0].
extern "C" void row_softmax_wide(const float* x, float* y, long long* team, long long rows, long long cols) {
    team[0] = 0;
#pragma omp parallel num_threads(omp_get_num_procs() > 2 ? omp_get_num_procs() : 4)
    {
#pragma omp single
        team[0] = omp_get_num_threads();
#pragma omp for
        for (long long r = 0; r < rows; ++r) {
            const float* xr = x + r * cols;
            float* yr = y + r * cols;
            float m = -INFINITY;
            for (long long c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
            float s = 0.f;
            for (long long c = 0; c < cols; ++c) {
                float e = expf(xr[c] - m);
                yr[c] = e;
                s += e;
            }
            float inv = 1.f / s;
            for (long long c = 0; c < cols; ++c) yr[c] *= inv;
        }
    }
}
