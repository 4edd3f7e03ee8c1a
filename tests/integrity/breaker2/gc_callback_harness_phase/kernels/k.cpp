// A kernel that does nothing: the launch is only there to be counted.
extern "C" void touch(float* y, long long n) { (void)y; (void)n; }
