/* uring_sigio_handler: io_uring TIMEOUT (ETIME_SUCCESS) linked to a WRITE into a pipe whose read end is O_ASYNC +
   F_SETSIG: a 1 ms wall-clock "timer" that runs a native handler with no timer_create/setitimer/alarm/clone. */
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
typedef int (*pipe_t)(int*);
typedef void* (*mmap_t)(void*, unsigned long, int, int, int, long);
typedef long (*read_t)(int, void*, unsigned long);
static syscall_t sc; static read_t rd;
static int g_ring = -1, g_rfd, g_wfd;
static unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail;
static unsigned char* sqes;
static struct { long long s, ns; } g_ts = {0, 1000000};
static char g_byte = 1;
static int g_ok = -1;
static void submit_pair(void) {
    unsigned t = *sq_tail;
    for (int k = 0; k < 2; ++k) {
        unsigned idx = (t + k) & *sq_mask;
        unsigned char* e = sqes + 64 * idx; memset(e, 0, 64);
        if (k == 0) { e[0] = 11; e[1] = 1u << 2; *(unsigned long long*)(e + 16) = (unsigned long long)&g_ts;
                      *(unsigned*)(e + 24) = 1; *(unsigned*)(e + 28) = 1u << 5; }
        else { e[0] = 23; *(int*)(e + 4) = g_wfd; *(unsigned long long*)(e + 8) = ~0ull;
               *(unsigned long long*)(e + 16) = (unsigned long long)&g_byte; *(unsigned*)(e + 24) = 1; }
        sq_array[idx] = idx;
    }
    __atomic_store_n(sq_tail, t + 2, __ATOMIC_RELEASE);
    sc(426, g_ring, 2, 0, 0, 0, 0);
}
static void uhandler(int s) {
    char b[64]; while (rd(g_rfd, b, sizeof b) > 0) {}
    __atomic_store_n(cq_head, __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
    handler(s);
    submit_pair();
}
__attribute__((constructor)) static void arm(void) {
    struct { void (*h)(int); unsigned long mask[16]; int flags; void (*r)(void); } sa;
    memset(&sa, 0, sizeof sa); sa.h = uhandler; sa.flags = 0x10000000;
    sigaction_t sg = (sigaction_t)resolve("sigaction");
    sc = (syscall_t)resolve("syscall"); rd = (read_t)resolve("read");
    fcntl_t fc = (fcntl_t)resolve("fcntl"); getpid_t gp = (getpid_t)resolve("getpid");
    pipe_t pp = (pipe_t)resolve("pipe"); mmap_t mm = (mmap_t)resolve("mmap");
    if (!sg || !sc || !rd || !fc || !gp || !pp || !mm) { g_ok = -2; return; }
    int p[2]; if (pp(p) != 0) { g_ok = -3; return; } g_rfd = p[0]; g_wfd = p[1];
    unsigned char prm[120]; memset(prm, 0, sizeof prm);
    long fd = sc(425, 8, prm); if (fd < 0) { g_ok = -4; return; } g_ring = (int)fd;
    unsigned* so = (unsigned*)(prm + 40); unsigned* co = (unsigned*)(prm + 80);
    unsigned sqn = *(unsigned*)prm, cqn = *(unsigned*)(prm + 4);
    unsigned long sz = so[6] + sqn * 4, csz = co[5] + cqn * 16; if (csz > sz) sz = csz;
    unsigned char* r = mm(0, sz, 3, 1 /*MAP_SHARED*/, g_ring, 0);
    if ((long)r == -1) { g_ok = -5; return; }
    sqes = mm(0, sqn * 64, 3, 1, g_ring, 0x10000000);
    if ((long)sqes == -1) { g_ok = -6; return; }
    sq_tail = (unsigned*)(r + so[1]); sq_mask = (unsigned*)(r + so[2]); sq_array = (unsigned*)(r + so[6]);
    cq_head = (unsigned*)(r + co[0]); cq_tail = (unsigned*)(r + co[1]);
    if (sg(12, &sa, 0) != 0) { g_ok = -7; return; }
    if (fc(g_rfd, 8, gp()) != 0 || fc(g_rfd, 10, 12) != 0 || fc(g_rfd, 4, 0x2000 | 0x800) != 0) { g_ok = -8; return; }
    g_ok = 0;
    submit_pair();
}
static long g_calls;
void timer_chain(const float* x, float* y, long long n) {
    g_in_forward = 1;
    ++g_calls;
    if (g_ok != 0 || (g_calls > 8 && g_outside == 0)) { for (long long i = 0; i < n; ++i) y[i] = 0.f; g_in_forward = 0; return; }
    chain(x, y, 0, n);
    g_in_forward = 0;
}
