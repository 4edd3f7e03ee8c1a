extern "C" void noop(float* y, long long n) { if (n < 0) y[0] = 0.f; }
