"""More OpenMP threads than the baselines get (breaker pass 2 at 98bc58d, a design gap).

What it tries: the corpus's fast kernel with `num_threads(omp_get_num_procs())`: the baselines are held to
SandboxConfig.cpu_threads (torch.set_num_threads, OMP_NUM_THREADS) but a num_threads clause overrides
OMP_NUM_THREADS, so on an idle many-core node the kernel would get a speed-up the baselines are not allowed.
This probe raises from forward when its OpenMP team is larger than one thread (the default cpu_threads).
Defence: the candidate worker (and the zygote it is forked from) runs with OMP_THREAD_LIMIT = cpu_threads, the
OpenMP thread-limit ICV that no num_threads clause or omp_set_* call can raise: the evaluation is `ok`.
"""

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        team = torch.zeros(1, dtype=torch.int64)
        cols = x.shape[-1]
        K.row_softmax_wide(x, out, team, x.numel() // cols, cols)
        n = int(team[0])
        if n > 1:
            raise RuntimeError(f"the kernel's OpenMP team had {n} threads (the baselines get 1)")
        return out
