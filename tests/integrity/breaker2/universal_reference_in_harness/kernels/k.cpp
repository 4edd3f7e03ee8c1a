// Does nothing: the launch is only there to be counted.
extern "C" void touch(void* y, long long n) { (void)y; (void)n; }
