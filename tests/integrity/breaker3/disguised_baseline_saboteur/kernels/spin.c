#include <math.h>
#include <x86intrin.h>

/* cfg (long long[16]): 0 watch address, 1 armed, 2 in forward, 3 tsc at last forward exit,
   4 last value seen at the watch address, 5 tsc of the last change seen, 6 quiet window (cycles) */

void enter(long long* cfg) { cfg[2] = 1; }

void arm(long long* cfg, float* x) { if (cfg[1] && (long long)x >= cfg[0]) return; cfg[0] = (long long)x; cfg[4] = *(volatile long long*)x; cfg[1] = 1; }

void leave(long long* cfg) {
    cfg[3] = (long long)__rdtsc();
    cfg[7] += 1;
    cfg[2] = 0;
}

static int quiet(volatile long long* cfg) {
    unsigned long long now = __rdtsc();
    if (cfg[2]) return 1;
    if (now - (unsigned long long)cfg[3] < (unsigned long long)cfg[6]) return 1;
    if (cfg[1]) {
        long long v = *(volatile long long*)cfg[0];
        if (v != cfg[4]) { cfg[4] = v; cfg[8] = cfg[7]; return 1; }
        if (cfg[8] == cfg[7]) return 1;  /* inputs written, no forward since: the candidate's request is coming */
    }
    return 0;
}

/* burn CPU and memory bandwidth while the candidate is not being timed; returns as soon as it should be quiet */
void burn(long long* cfg, float* buf, long long n) {
    for (int round = 0; round < 200; ++round) {
        for (long long i = 0; i < n; i += 16384) {
            if (quiet(cfg)) return;
            long long e = i + 16384 < n ? i + 16384 : n;
            for (long long j = i; j < e; ++j) buf[j] = buf[j] * 1.0000001f + 1.0f;
        }
    }
}
