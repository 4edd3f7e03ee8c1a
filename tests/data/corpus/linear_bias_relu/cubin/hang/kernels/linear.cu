// Hangs: a spin lock that is taken and never released.
extern "C" __global__ void linear_bias_relu(const float* x, const float* w, const float* bias, float* out, int batch,
                                            int in_f, int out_f) {
    __shared__ int lock;
    if (threadIdx.x == 0 && threadIdx.y == 0) lock = 1;
    __syncthreads();
    while (atomicCAS(&lock, 0, 1) != 0) {
    }
    out[0] = x[0] + w[0] + bias[0];
}
