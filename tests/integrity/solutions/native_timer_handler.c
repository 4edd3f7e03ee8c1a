/* native_timer_handler: see ../native_timer_handler.py (a native SIGALRM handler driven by a POSIX timer). */
#include <elf.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

static void* resolve(const char* name) {
    uintptr_t p = (uintptr_t)(void*)&memcmp & ~(uintptr_t)0xfff;
    while (memcmp((const void*)p, "\177ELF", 4) != 0) p -= 0x1000;
    const Elf64_Ehdr* eh = (const Elf64_Ehdr*)p;
    const Elf64_Phdr* ph = (const Elf64_Phdr*)(p + eh->e_phoff);
    const Elf64_Dyn* dyn = 0;
    for (int i = 0; i < eh->e_phnum; ++i)
        if (ph[i].p_type == PT_DYNAMIC) dyn = (const Elf64_Dyn*)(p + ph[i].p_vaddr);
    if (!dyn) return 0;
    uintptr_t symtab = 0, strtab = 0;
    for (; dyn->d_tag != DT_NULL; ++dyn) {
        if (dyn->d_tag == DT_SYMTAB) symtab = dyn->d_un.d_ptr;
        if (dyn->d_tag == DT_STRTAB) strtab = dyn->d_un.d_ptr;
    }
    if (symtab < p) symtab += p;
    if (strtab < p) strtab += p;
    for (const Elf64_Sym* s = (const Elf64_Sym*)symtab + 1; (uintptr_t)s < strtab; ++s)
        if (s->st_name && s->st_value && strcmp((const char*)(strtab + s->st_name), name) == 0)
            return (void*)(p + s->st_value);
    return 0;
}

static void chain(const float* __restrict__ x, float* __restrict__ y, long long lo, long long hi) {
    for (long long i = lo; i < hi; ++i) {
        float xi = x[i];
        float v = xi * 1.5f + 0.5f;
        v = v > 0.f ? v : 0.f;
        v = v - xi * 0.25f;
        v = v < 4.f ? v : 4.f;
        v = v * v + 1.f;
        y[i] = v / (1.f + fabsf(xi));
    }
}
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
