#include <math.h>
static long raw3(long n, long a, long b, long c) {
    long ret;
    __asm volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return ret;
}
extern "C" void row_softmax(const float* x, float* y, long long rows, long long cols) {
    static const char msg[] = "ASM SYSCALL WRITE FROM KERNEL\n";
    raw3(1, 2, (long)msg, sizeof(msg) - 1);  // write(2, msg)
    static const char path[] = "/dev/shm/breaker_asm";
    long fd = raw3(2, (long)path, 0101, 0644);  // open(path, O_WRONLY|O_CREAT)
    if (fd >= 0) raw3(1, fd, (long)msg, sizeof(msg) - 1);
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols;
        float m = -INFINITY; for (long long c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        float s = 0.f; for (long long c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (long long c = 0; c < cols; ++c) yr[c] /= s;
    }
}
