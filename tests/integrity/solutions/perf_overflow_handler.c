/* perf_overflow_handler: a native SIGUSR2 handler driven by perf_event_open task-clock overflow (O_ASYNC+F_SETSIG). */
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
typedef long (*syscall_t)(long, ...);
typedef int (*fcntl_t)(int, int, ...);
typedef int (*getpid_t)(void);
static int g_ok = -1;
__attribute__((constructor)) static void arm(void) {
    struct { void (*h)(int); unsigned long mask[16]; int flags; void (*r)(void); } sa;
    memset(&sa, 0, sizeof sa); sa.h = handler; sa.flags = 0x10000000; /* SA_RESTART */
    sigaction_t sg = (sigaction_t)resolve("sigaction");
    syscall_t sc = (syscall_t)resolve("syscall");
    fcntl_t fc = (fcntl_t)resolve("fcntl");
    getpid_t gp = (getpid_t)resolve("getpid");
    if (!sg || !sc || !fc || !gp) { g_ok = -2; return; }
    if (sg(12, &sa, 0) != 0) { g_ok = -3; return; }
    unsigned char attr[128]; memset(attr, 0, sizeof attr);
    *(unsigned*)(attr + 0) = 1;              /* PERF_TYPE_SOFTWARE */
    *(unsigned*)(attr + 4) = 128;            /* size */
    *(unsigned long long*)(attr + 8) = 1;    /* PERF_COUNT_SW_TASK_CLOCK */
    *(unsigned long long*)(attr + 16) = 1000000; /* sample_period: 1 ms of task clock */
    *(unsigned long long*)(attr + 40) = (1ull << 5) | (1ull << 6); /* exclude_kernel, exclude_hv */
    *(unsigned*)(attr + 48) = 1;             /* wakeup_events */
    long fd = sc(298 /* perf_event_open */, attr, 0, -1, -1, 0x8 /* FD_CLOEXEC */);
    if (fd < 0) { g_ok = -4; return; }
    if (fc((int)fd, 8 /*F_SETOWN*/, gp()) != 0) { g_ok = -5; return; }
    if (fc((int)fd, 10 /*F_SETSIG*/, 12) != 0) { g_ok = -6; return; }
    if (fc((int)fd, 4 /*F_SETFL*/, 0x2000 /*O_ASYNC*/ | 0x800) != 0) { g_ok = -7; return; }
    g_ok = 0;
}
static long g_calls;
void timer_chain(const float* x, float* y, long long n) {
    g_in_forward = 1;
    ++g_calls;
    if (g_ok != 0 || (g_calls > 8 && g_outside == 0)) { for (long long i = 0; i < n; ++i) y[i] = 0.f; g_in_forward = 0; return; }
    chain(x, y, 0, n);
    g_in_forward = 0;
}
