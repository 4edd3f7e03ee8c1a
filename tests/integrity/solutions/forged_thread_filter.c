/* forged_thread_filter: see ../forged_thread_filter.py (a seccomp filter of its own that fakes the harness's install,
   then per-call CLONE_VM children). */
#include "adversarial_native.h"

typedef long (*sc_t)(long, ...);
typedef int (*prctl_t)(int, unsigned long, unsigned long, unsigned long, unsigned long);
typedef int (*clone_t)(int (*)(void*), void*, int, void*, ...);
typedef int (*waitpid_t)(int, int*, int);

struct sf { unsigned short code; unsigned char jt, jf; unsigned int k; };
struct sfprog { unsigned short len; struct sf* filter; };
static struct sf g_prog[] = {
    {0x20, 0, 0, 0},                 /* ld nr */
    {0x15, 0, 1, 317},               /* jeq __NR_seccomp */
    {0x06, 0, 0, 0x00050000},        /* ret ERRNO|0: "success" */
    {0x06, 0, 0, 0x7FFF0000},        /* ret ALLOW */
};
int g_forged = -1;

__attribute__((constructor)) static void forge(void) {
    sc_t sc = (sc_t)resolve("sys" "call");
    prctl_t pr = (prctl_t)resolve("prctl");
    if (!sc || !pr) return;
    if (pr(38, 1, 0, 0, 0) != 0) return;
    struct sfprog fp = {4, g_prog};
    g_forged = (int)sc(317, 1, 0, &fp);
}

static _Alignas(64) char g_stack[1 << 18];
static const float* g_x; static float* g_y; static long long g_lo, g_hi;
static int child(void* a) { (void)a; chain(g_x, g_y, g_lo, g_hi); return 0; }
static clone_t g_clone; static waitpid_t g_wait; static int g_init;

void split_chain(const float* x, float* y, long long n) {
    if (!g_init) {
        g_clone = (clone_t)resolve("clone");
        g_wait = (waitpid_t)resolve("waitpid");
        g_init = (g_clone && g_wait && g_forged == 0) ? 1 : -1;
    }
    if (g_init < 0 || n < 4096) { chain(x, y, 0, n); return; }
    long long mid = n / 2;
    g_x = x; g_y = y; g_lo = mid; g_hi = n;
    int pid = g_clone(child, g_stack + sizeof g_stack, 0x00000100 /*CLONE_VM*/ | 17 /*SIGCHLD*/, 0);
    if (pid <= 0) { chain(x, y, mid, n); pid = 0; }
    chain(x, y, 0, mid);
    if (pid > 0) { int st; g_wait(pid, &st, 0); }
}
