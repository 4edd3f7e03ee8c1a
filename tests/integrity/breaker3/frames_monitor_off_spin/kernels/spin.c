#include <x86intrin.h>
/* touch one float per page of the output (its page faults then happen inside the call, where the trusted wall
   clock and the in-process clock both see them), then busy-wait until `cycles` TSC cycles have passed */
void spin(float* p, long long n, long long cycles) {
    unsigned long long t = __rdtsc();
    for (long long i = 0; i < n; i += 1024) p[i] = 0.f;
    while ((long long)(__rdtsc() - t) < cycles) { }
}
