"""The flip-group product of a Pauli sum on CUDA states as one Triton kernel per chunk of groups.

``out[b, i] (+)= sum_g D[g, i] x[b, i ^ m_g]`` (:func:`qdiff.circuits.paulis.apply`'s
``kernel``): the torch loop takes a gather and a multiply-add per group, two kernel launches
and a round of Python each, which is what a GPU spends its time on below about 2**20
amplitudes; here each block of amplitudes runs through every group of the chunk with its sum
in registers, so a product is one launch and one write of ``out``. A group of X words alone has
a constant diagonal: its value is read, not its row. Complex states and diagonals are read as
interleaved real pairs; sums run in the states' precision.

Triton ships with CUDA builds of torch; without it, or with the native kernels off (no C
compiler, which Triton's launcher needs too; ``QDIFF_NATIVE=0``), the torch loop runs.
``TRITON_INTERPRET=1`` runs the same kernel on CPU tensors (tests).
"""
from __future__ import annotations

import contextlib
import functools
import warnings

import torch

from qdiff.circuits.errors import QdiffError
from qdiff.circuits.paulis import xor_permute
from qdiff.backends.statevector.native import library, resolved, transform_free

DTYPES = (torch.complex128, torch.complex64, torch.float64, torch.float32)
BLOCK = 1024
_GRID_ROWS = 1 << 30  # programs per launch, well inside CUDA's 2**31 - 1


@functools.lru_cache(maxsize=1)
def _kernel():
    """The compiled-on-first-use Triton kernel, or ``None`` when Triton cannot be imported."""
    try:
        import triton
        import triton.language as tl
    except Exception:  # noqa: BLE001 - any failure to import means: no Triton path
        return None

    # the group count and the grid's offsets vary from call to call: one compilation for all
    @triton.jit(do_not_specialize=["num_groups", "nblocks", "first"])
    def pauli_groups(x_ptr, d_ptr, masks_ptr, rows_ptr, out_ptr, num_groups, dim, nblocks,
                     first, XC: tl.constexpr, DC: tl.constexpr, ACC: tl.constexpr,
                     BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64) + first
        b = pid // nblocks
        offs = (pid % nblocks) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        valid = offs < dim
        base = b * dim
        acc_r = tl.zeros((BLOCK,), dtype=out_ptr.dtype.element_ty)
        acc_i = tl.zeros((BLOCK,), dtype=out_ptr.dtype.element_ty)
        for g in range(num_groups):
            m = tl.load(masks_ptr + g)
            r = tl.load(rows_ptr + g)
            j = base + (offs ^ m)
            if XC:
                xr = tl.load(x_ptr + 2 * j, mask=valid, other=0.0)
                xi = tl.load(x_ptr + 2 * j + 1, mask=valid, other=0.0)
            else:
                xr = tl.load(x_ptr + j, mask=valid, other=0.0)
            # a constant group's value sits at its row's first entry: every lane reads it
            row = g.to(tl.int64) * dim  # past 2**31 entries for many groups of large states
            k = tl.where(r < 0, row, row + offs)
            if DC:
                dr = tl.load(d_ptr + 2 * k, mask=valid, other=0.0)
                di = tl.load(d_ptr + 2 * k + 1, mask=valid, other=0.0)
                acc_r += dr * xr - di * xi
                acc_i += dr * xi + di * xr
            else:
                dr = tl.load(d_ptr + k, mask=valid, other=0.0)
                acc_r += dr * xr
                if XC:
                    acc_i += dr * xi
        o = base + offs
        if XC:
            if ACC:
                acc_r += tl.load(out_ptr + 2 * o, mask=valid, other=0.0)
                acc_i += tl.load(out_ptr + 2 * o + 1, mask=valid, other=0.0)
            tl.store(out_ptr + 2 * o, acc_r, mask=valid)
            tl.store(out_ptr + 2 * o + 1, acc_i, mask=valid)
        else:
            if ACC:
                acc_r += tl.load(out_ptr + o, mask=valid, other=0.0)
            tl.store(out_ptr + o, acc_r, mask=valid)

    return pauli_groups


def _reals(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as reals (a complex one as interleaved pairs)."""
    return torch.view_as_real(t) if t.is_complex() else t


def _group_rows(groups, lo: int, hi: int, device) -> tuple:
    """The masks and diagonal rows (:meth:`~qdiff.circuits.paulis.PauliGroups.kernel_rows`)
    of groups ``lo..hi`` on ``device``, kept with the groups (one copy to the device each)."""
    held = groups.__dict__.setdefault("_device_rows", {})
    key = (lo, hi, str(device))
    hit = held.get(key)  # read once: another thread may clear the entries meanwhile
    if hit is None:
        if len(held) > 64:
            held.clear()
        hit = held.setdefault(key, (groups.mask_tensor[lo:hi].to(device),
                                    groups.kernel_rows(lo, hi).to(device)))
    return hit


class TritonPauliKernel:
    """The flip-group product for CUDA states (``kernel.takes(x)``, ``kernel(x, groups, lo,
    hi, d, out)``, as :func:`qdiff.circuits.paulis.register_kernel` describes)."""

    def takes(self, x: torch.Tensor) -> bool:
        """Whether states ``x`` ``(B, 2**n)`` (complex128/complex64, or float64/float32 for a
        real matrix, on a CUDA device, not under a torch.func transform; the caller keeps
        autograd out) go to the Triton kernel, while the native kernels are on."""
        return (x.dim() == 2 and x.device.type == "cuda" and x.dtype in DTYPES
                and transform_free(x) and self.failed is None and library() is not None
                and _kernel() is not None)

    failed = None  # why the kernel could not compile or launch here (then the torch loop runs)

    def __call__(self, x: torch.Tensor, groups, lo: int, hi: int, d: torch.Tensor,
                 out: torch.Tensor = None) -> torch.Tensor:
        """``out`` (new when ``None``, else added to) for states ``x`` taken by :meth:`takes`,
        the groups ``lo..hi`` of :class:`~qdiff.circuits.paulis.PauliGroups` ``groups`` and
        their diagonals ``d`` ``(hi - lo, 2**n)`` (real, or complex for complex states)."""
        kernel = _kernel()
        if kernel is None:
            raise QdiffError("Pauli sums on CUDA states: Triton could not be imported")
        x = resolved(x.detach())
        rows, dim = x.shape
        if d.shape != (hi - lo, dim):
            raise QdiffError(f"Pauli-sum diagonals of shape {tuple(d.shape)} for {hi - lo} "
                             f"groups on states of length {dim}")
        dcomplex = d.is_complex()
        if dcomplex and not x.is_complex():
            raise QdiffError("a complex Pauli-sum diagonal on real states")
        d = d.detach().to(x.device, x.dtype if dcomplex else x.real.dtype)
        accumulate = out is not None
        if out is None:
            out = torch.empty_like(x)
        elif out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
            raise QdiffError(f"a Pauli-sum product adds to a contiguous {x.dtype} tensor of "
                             f"shape {tuple(x.shape)}; got {out.dtype} {tuple(out.shape)}")
        if rows == 0 or hi == lo:
            return out if accumulate else out.zero_()
        if TritonPauliKernel.failed is not None:  # it could not run here before
            return _torch_loop(x, groups, lo, hi, d, out if accumulate else None)
        masks, drows = _group_rows(groups, lo, hi, x.device)
        xf, df = _reals(x), _reals(resolved(d))
        of = _reals(out)
        block = min(BLOCK, max(16, 1 << (dim - 1).bit_length()))
        nblocks = -(-dim // block)
        total = rows * nblocks
        with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
            for first in range(0, total, _GRID_ROWS):
                grid = (min(_GRID_ROWS, total - first),)
                try:
                    kernel[grid](xf, df, masks, drows, of, hi - lo, dim, nblocks, first,
                                 XC=x.is_complex(), DC=dcomplex, ACC=accumulate, BLOCK=block)
                except Exception as exc:  # noqa: BLE001 - Triton's compiler and launcher
                    if first:  # a later launch: earlier ones wrote their rows already
                        raise
                    # a first launch fails before it writes (no host C compiler for Triton's
                    # launcher, a GPU it cannot target): the torch loop, from now on
                    TritonPauliKernel.failed = f"{type(exc).__name__}: {exc}"
                    warnings.warn("Pauli sums on CUDA states: the Triton kernel could not run "
                                  f"({TritonPauliKernel.failed[:300]}); the torch loop runs "
                                  "instead", RuntimeWarning, stacklevel=2)
                    return _torch_loop(x, groups, lo, hi, d, out if accumulate else None)
        return out


def _torch_loop(x: torch.Tensor, groups, lo: int, hi: int, d: torch.Tensor,
                out: torch.Tensor = None) -> torch.Tensor:
    """What the kernel computes, by a gather and a multiply-add per group."""
    out = torch.zeros_like(x) if out is None else out
    for k in range(hi - lo):
        m = groups.masks[lo + k]
        out.add_(d[k] * (x if m == 0 else xor_permute(x, m, groups.n, dim=1)))
    return out


pauli_kernel = TritonPauliKernel()
