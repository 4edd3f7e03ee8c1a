"""Compare a candidate's outputs with the reference's (runs on the trusted side, on the reference's device).

Rules (KernelBench's, made strict): same structure (one tensor, or a tuple/list of tensors of the same length;
tuple and list are interchangeable), same shapes and dtypes, and every element within
`|cand - ref| <= atol + rtol * |ref|`. Where the reference is finite, the candidate must be finite (a NaN there
usually means memory the kernel never wrote, which the guard poisoned); where the reference is NaN / +-Inf the
candidate must match it.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import torch

from sandbox.result import TrialResult


def flatten_outputs(out: Any) -> list[torch.Tensor] | None:
    """[tensor] for a tensor, the list for a tuple/list of tensors, None for anything else."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and out and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    return None


def describe_structure(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return f"tensor{tuple(out.shape)} {out.dtype}"
    if isinstance(out, (tuple, list)):
        return f"{type(out).__name__} of {len(out)}: [" + ", ".join(describe_structure(x) for x in out[:4]) + \
            (", ..." if len(out) > 4 else "") + "]"
    return type(out).__name__


def compare(ref: Any, cand: Any, atol: float, rtol: float, index: int) -> TrialResult:
    """One trial's verdict. ref, cand: model outputs (tensors on any device). Never raises for bad candidates."""
    r = flatten_outputs(ref)
    c = flatten_outputs(cand)
    if r is None:
        return TrialResult(index, False, message=f"reference returned {describe_structure(ref)} (not comparable)")
    if c is None or len(c) != len(r) or (isinstance(ref, torch.Tensor) != isinstance(cand, torch.Tensor)):
        return TrialResult(index, False, message=f"output structure differs: expected {describe_structure(ref)}, "
                                                 f"got {describe_structure(cand)}")
    max_abs = 0.0
    max_rel = 0.0
    mismatched = 0
    numel = 0
    problems: list[str] = []
    for i, (rt, ct) in enumerate(zip(r, c)):
        where = f"output {i}" if len(r) > 1 else "output"
        if tuple(rt.shape) != tuple(ct.shape):
            return TrialResult(index, False, message=f"{where}: shape {tuple(ct.shape)}, expected {tuple(rt.shape)}")
        if rt.dtype != ct.dtype:
            return TrialResult(index, False, message=f"{where}: dtype {ct.dtype}, expected {rt.dtype}")
        numel += rt.numel()
        if rt.numel() == 0:
            continue
        n_nf, n_sp, n_val, t_abs, t_rel = _compare_tensor(rt, ct, atol, rtol)
        nel = rt.numel() * (2 if rt.is_complex() else 1)  # counts are of real components (view_as_real)
        mismatched += n_nf + n_sp + n_val
        max_abs, max_rel = max(max_abs, t_abs), max(max_rel, t_rel)
        if rt.dtype == torch.bool:
            if n_val:
                problems.append(f"{where}: {n_val} of {rt.numel()} boolean elements differ")
            continue
        if n_nf:
            max_abs = math.inf
            problems.append(f"{where}: {n_nf} of {nel} elements are NaN/Inf where the reference is finite "
                            "(unwritten output memory reads as NaN)")
        if n_sp:
            problems.append(f"{where}: {n_sp} elements differ where the reference is NaN/Inf")
        if n_val:
            problems.append(f"{where}: {n_val} of {nel} elements outside atol={atol:g} + rtol={rtol:g}*|ref| "
                            f"(max abs error {t_abs:.4g})")
    ok = mismatched == 0
    return TrialResult(index, ok, max_abs_err=max_abs, max_rel_err=max_rel, mismatched=mismatched, numel=numel,
                       message="; ".join(problems))


CHUNK_ELEMENTS = 1 << 25  # 128 MiB of float32 per pass: bounds the temporaries (the float64 path's are 8x that)


def _compare_tensor(rt: torch.Tensor, ct: torch.Tensor, atol: float, rtol: float) -> tuple[int, int, int, float, float]:
    """(non-finite where the reference is finite, special values that differ, values outside the tolerance,
    max abs error, max rel error) of one output pair of the same shape and dtype.

    Runs on the reference's device (the candidate's copy is moved there, chunk by chunk), over flat chunks of
    CHUNK_ELEMENTS so the temporaries stay bounded (the float64 path of a 2 GiB output would otherwise hold ~24 GiB).
    The trusted worker passes CPU copies of the reference (they never go back to the device while solution code
    runs) and compares with SandboxConfig.verify_threads threads on a GPU host."""
    r_all = rt.detach().reshape(-1)
    c_all = ct.detach().reshape(-1)
    dev = r_all.device
    n_nf = n_sp = n_val = 0
    max_abs = max_rel = 0.0
    for lo in range(0, r_all.numel(), CHUNK_ELEMENTS):
        r = r_all[lo:lo + CHUNK_ELEMENTS]
        c = c_all[lo:lo + CHUNK_ELEMENTS].to(dev)
        if r.dtype == torch.bool:
            n_val += int((r != c).sum())
            continue
        fast = _within_fast(r, c, atol, rtol)
        if fast is not None:  # every element well inside the tolerance: the verdict of the exact path below
            max_abs, max_rel = max(max_abs, fast[0]), max(max_rel, fast[1])
            continue
        rd = r.to(torch.float64) if not r.is_complex() else torch.view_as_real(r).double()
        cd = c.to(torch.float64) if not c.is_complex() else torch.view_as_real(c).double()
        r_fin = torch.isfinite(rd)
        c_fin = torch.isfinite(cd)
        # where the reference is not finite, the candidate must be the same special value
        special_bad = ~r_fin & ~((torch.isnan(rd) & torch.isnan(cd)) | (rd == cd))
        both = r_fin & c_fin
        diff = torch.where(both, (cd - rd).abs(), torch.zeros_like(rd))
        tol = atol + rtol * rd.abs()
        n_nf += int((r_fin & ~c_fin).sum())
        n_sp += int(special_bad.sum())
        n_val += int((both & (diff > tol)).sum())
        if both.any():
            max_abs = max(max_abs, float(diff.max()))
            rel = torch.where(both, diff / (rd.abs() + 1e-12), torch.zeros_like(rd))
            max_rel = max(max_rel, float(rel.max()))
    return n_nf, n_sp, n_val, max_abs, max_rel


_FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MARGIN = 1.0 - 1e-5  # float32 rounding of diff and tol is below 1e-6 relative: inside this margin means inside in float64


def _within_fast(rt: torch.Tensor, ct: torch.Tensor, atol: float, rtol: float) -> tuple[float, float] | None:
    """(max abs error, max rel error) when the reference is finite and every element of ct is within
    (1 - 1e-5) * (atol + rtol * |ref|) of it, computed in float32 on their device (a third of the float64 path's
    passes and half its bytes); None otherwise, and the exact float64 path decides. Same shape and dtype assumed
    (checked before)."""
    if rt.dtype not in _FAST_DTYPES or rt.numel() == 0:
        return None
    r, c = rt, ct
    if r.dtype != torch.float32:
        r, c = r.float(), c.float()
    if not bool(torch.isfinite(r).all()):
        return None
    diff = (c - r).abs_()  # NaN where c is NaN, inf where c is inf: both fail the test below
    absr = r.abs()
    tol = absr.mul(rtol).add_(atol).mul_(_MARGIN)
    if not bool((diff <= tol).all()):
        return None
    max_abs = float(diff.max())
    max_rel = float(diff.div_(absr.add_(1e-12)).max())
    return max_abs, max_rel


def precision_shortfall(ref: Any, cand: Any, budget: dict[str, float], floor: float = 1e-2) -> str:
    """"" when the candidate's precision is as expected, else a message starting with "precision:".

    Tolerances (atol/rtol 1e-2) are wide enough for a kernel that computes in bfloat16 or TF32 to pass; they are
    meant for the differences of a different summation order. This check looks at the *median* relative error over
    all elements, |cand - ref| / max(|ref|, floor), which an fp32 kernel keeps near 1e-7..1e-5 whatever its order
    of operations, and which reduced precision lifts to 1e-4..1e-3. budget: dtype name -> largest allowed median
    (dtypes not in it are not checked).
    """
    r = flatten_outputs(ref)
    c = flatten_outputs(cand)
    if r is None or c is None or len(r) != len(c):
        return ""
    for i, (rt, ct) in enumerate(zip(r, c)):
        name = str(rt.dtype).removeprefix("torch.")
        if name not in budget or rt.numel() < 16 or rt.shape != ct.shape:
            continue
        rd = rt.detach().reshape(-1)
        cd = ct.detach().reshape(-1)
        if rd.numel() > 65536:  # the median of a strided subsample with a random offset: cheap, and unpredictable
            step = rd.numel() // 65536
            start = secrets.randbelow(step)
            rd, cd = rd[start::step], cd[start::step]
        rd, cd = rd.cpu().double(), cd.cpu().double()  # the subsample only leaves the device
        ok = torch.isfinite(rd) & torch.isfinite(cd)
        if int(ok.sum()) < 16:
            continue
        rd, cd = rd[ok], cd[ok]
        med = float(((cd - rd).abs() / rd.abs().clamp_min(floor)).median())
        if med > budget[name]:
            where = f"output {i}" if len(r) > 1 else "output"
            return (f"precision: {where}: median relative error {med:.2e} exceeds the {name} budget "
                    f"{budget[name]:.0e} (reduced precision beyond what the tolerance is for)")
    return ""
