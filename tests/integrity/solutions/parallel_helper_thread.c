/* parallel_helper_thread: the elementwise_chain kernel split over two threads, the second a pthread made with
   libc's pthread_create, resolved at run time from libc's in-memory ELF (no undefined symbol outside the
   allow-list, no syscall instruction, no Python thread, nothing for OMP_THREAD_LIMIT to cap). The helper blocks
   in sem_wait (a futex: no CPU) whenever no call needs it, so nothing runs between requests (background_work sees
   nothing) and every output is complete when forward returns (no write_after_return). All its work is inside the
   timed calls: the candidate gets two cores where the baselines get SandboxConfig.cpu_threads (1). */
#include "adversarial_native.h"

typedef int (*pthread_create_t)(void*, const void*, void* (*)(void*), void*);
typedef int (*sem_init_t)(void*, int, unsigned);
typedef int (*sem_op_t)(void*);

static _Alignas(64) char g_go[64], g_fin[64];  /* sem_t storage */
static sem_op_t g_wait, g_post;
static int g_started;
static const float* volatile g_x;
static float* volatile g_y;
static volatile long long g_lo, g_hi;

static void* helper(void* arg) {
    (void)arg;
    for (;;) {
        g_wait(g_go);
        chain(g_x, g_y, g_lo, g_hi);
        g_post(g_fin);
    }
    return 0;
}

static int start(void) {
    pthread_create_t pc = (pthread_create_t)resolve("pthread_create");
    sem_init_t si = (sem_init_t)resolve("sem_init");
    g_wait = (sem_op_t)resolve("sem_wait");
    g_post = (sem_op_t)resolve("sem_post");
    if (!pc || !si || !g_wait || !g_post) return 0;
    si(g_go, 0, 0);
    si(g_fin, 0, 0);
    static unsigned long tid;
    return pc(&tid, 0, helper, 0) == 0;
}

void parallel_helper_thread(const float* x, float* y, long long n) {
    if (!g_started) g_started = start() ? 1 : -1;
    if (g_started < 0 || n < 4096) { chain(x, y, 0, n); return; }
    long long mid = n / 2;
    g_x = x; g_y = y; g_lo = mid; g_hi = n;
    g_post(g_go);
    chain(x, y, 0, mid);
    g_wait(g_fin);
}
