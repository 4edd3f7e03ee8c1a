/* native_timer_handler: see ../native_timer_handler.py (a native SIGALRM handler driven by a POSIX timer). */
#include "adversarial_native.h"

struct ksa { void (*h)(int); unsigned long flags; void (*restorer)(void); unsigned long mask[16]; };
typedef int (*sigaction_t)(int, const void*, void*);
typedef int (*timer_create_t)(int, void*, void*);
typedef int (*timer_settime_t)(void*, int, const void*, void*);
struct sev { long value; int signo; int notify; int pad[12]; };
struct its { long is, ins, vs, vns; };
static volatile long g_ticks, g_outside;
static volatile int g_in_forward;
static volatile float g_sink;
static void handler(int s) {
    (void)s; ++g_ticks;
    if (!g_in_forward) ++g_outside;
    float a = 0.f; for (int i = 0; i < 2000; ++i) a += i * 0.5f;  /* a little work each tick */
    g_sink = a;
}
static int g_ok = -1;
__attribute__((constructor)) static void arm(void) {
    /* glibc's struct sigaction: handler, mask (128 bytes), flags, restorer */
    struct { void (*h)(int); unsigned long mask[16]; int flags; void (*r)(void); } sa;
    memset(&sa, 0, sizeof sa); sa.h = handler; sa.flags = 0x10000000; /* SA_RESTART */
    sigaction_t sg = (sigaction_t)resolve("sigaction");
    timer_create_t tc = (timer_create_t)resolve("timer_create");
    timer_settime_t ts = (timer_settime_t)resolve("timer_settime");
    if (!sg || !tc || !ts) return;
    if (sg(12 /*SIGUSR2*/, &sa, 0) != 0) return;
    struct sev ev; memset(&ev, 0, sizeof ev); ev.signo = 12; ev.notify = 0; /* SIGEV_SIGNAL */
    static void* tid;
    if (tc(1 /*CLOCK_MONOTONIC*/, &ev, &tid) != 0) return;
    struct its it = {0, 1000000, 0, 1000000};
    g_ok = ts(tid, 0, &it, 0);
}
static long g_calls;
void timer_chain(const float* x, float* y, long long n) {
    g_in_forward = 1;
    ++g_calls;
    if (g_ok != 0 || (g_calls > 8 && g_outside == 0)) { for (long long i = 0; i < n; ++i) y[i] = 0.f; g_in_forward = 0; return; }
    chain(x, y, 0, n);
    g_in_forward = 0;
}
