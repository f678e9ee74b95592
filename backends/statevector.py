"""The embedded default backend: a pure-torch statevector simulator (CPU or CUDA).

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2, dtype=torch.complex64)
>>> dev.cdtype
torch.complex64
"""
from __future__ import annotations

from typing import Optional

import torch

from qdiff.backends import measure, native
from qdiff.backends.base import Backend, Capabilities, register_backend
from qdiff.backends.simulate import simulate
from qdiff.circuits.errors import QdiffError

_DTYPES = {torch.complex128: torch.complex128, torch.complex64: torch.complex64,
           torch.float64: torch.complex128, torch.float32: torch.complex64,
           "complex128": torch.complex128, "complex64": torch.complex64}


@register_backend("statevector", "default", "default.qubit", "torch")
class StatevectorBackend(Backend):
    """Batched torch statevector simulation; exact, or sampled with a seeded generator.

    Args:
        wires: number of wires or their labels.
        shots: None for exact results, or the number of samples per measurement.
        device: torch device (``"cpu"``, ``"cuda"``, ...).
        dtype: ``torch.complex128`` (default) or ``torch.complex64``.
        seed: seed of the sampling generator (same seed, same samples).
    """

    name = "statevector"
    capabilities = Capabilities(backprop=True, adjoint=True, shots=True, exact=True)

    def __init__(self, wires, shots: Optional[int] = None, device=None, dtype=torch.complex128,
                 seed: Optional[int] = None, fuse: bool = True):
        super().__init__(wires, shots, seed)
        if dtype not in _DTYPES:
            raise QdiffError(f"dtype must be complex128 or complex64; got {dtype}")
        self.cdtype = _DTYPES[dtype]
        try:
            self.torch_device = torch.device(device) if device is not None else None
        except RuntimeError as exc:
            raise QdiffError(f"invalid torch device {device!r}: {exc}") from None
        if self.torch_device is not None and self.torch_device.type == "cuda" and \
                not torch.cuda.is_available():
            raise QdiffError(f"device={device!r}: no CUDA device is available here (use 'cpu')")
        self.fuse = fuse
        self._generator = None

    def native_kernels(self, theta_device=None) -> bool:
        """Whether exact no-grad runs go through the native CPU kernels (CPU, complex128, the
        library built): then the adjoint method is the fast gradient (see ``diff_method='best'``)."""
        dev = self.torch_device or torch.device(theta_device or "cpu")
        return dev.type == "cpu" and self.cdtype == torch.complex128 and \
            native.library() is not None

    def generator(self, device) -> torch.Generator:
        if self._generator is None or self._generator.device != torch.device(device):
            g = torch.Generator(device=device)
            if self.seed is not None:
                g.manual_seed(int(self.seed))
            else:
                g.seed()
            self._generator = g
        return self._generator

    def target_device(self, theta: torch.Tensor) -> torch.device:
        return self.torch_device if self.torch_device is not None else theta.device

    def final_state(self, circuit, theta, initial_state=None) -> torch.Tensor:
        dev = self.target_device(theta)
        return simulate(circuit, theta.to(dev), initial_state, self.cdtype, dev, self.fuse)

    def execute(self, circuit, theta, initial_state=None, shots="device") -> list:
        shots = self.shots if shots == "device" else shots
        state = self.final_state(circuit, theta, initial_state)
        return measure_all(state, circuit, shots, self.generator(state.device) if shots else None)


_SIGNS: dict = {}
_SIGN_BUDGET = 1 << 22  # entries of a cached (2**n, T) sign matrix (32 MiB in float64)


def _z_word(m) -> bool:
    return (m.kind == "expval" and m.obs.is_pauli and len(m.obs.terms) == 1
            and all(f.kind == "Z" for f in m.obs.terms[0]))


def _sign_matrix(words: tuple, n: int, dtype, device) -> torch.Tensor:
    """``S[x, t] = (-1)**popcount(x & mask_t)`` for Z words given as wire tuples."""
    key = (words, n, dtype, str(device))
    if key not in _SIGNS:
        x = torch.arange(2 ** n, device=device)
        cols = []
        for wires in words:
            par = torch.zeros_like(x)
            for w in wires:
                par ^= (x >> (n - 1 - w)) & 1
            cols.append(1 - 2 * par)
        _SIGNS[key] = torch.stack(cols, dim=-1).to(dtype)
    return _SIGNS[key]


def half_register_words(words: dict, n: int) -> list:
    """Group Z words ``{key: wire tuple}`` by the half of the register they lie in:
    ``[(first wire, half size, keys, words shifted into the half)]`` for the first ``n // 2``
    wires and the rest; words spanning both halves are in neither."""
    a = n // 2
    out = []
    for lo, m in ((0, a), (a, n - a)):
        keys = [k for k, ws in words.items() if all(lo <= w < lo + m for w in ws)]
        out.append((lo, m, keys, tuple(tuple(w - lo for w in words[k]) for k in keys)))
    return out


def _joint_z_expvals(state, circuit) -> dict:
    """Z-word expvals from one ``|psi|^2``: one sign matmul on a small register; on a large
    one, the probabilities are first summed to the two halves' marginals (two reductions), and
    each word within a half is a matmul with that half's small sign matrix (words that span
    both halves are left to the general path)."""
    n = circuit.num_wires
    idx = [i for i, m in enumerate(circuit.measurements) if _z_word(m)]
    big = (2 ** n) * len(idx) > _SIGN_BUDGET or n >= 12
    if not idx or (len(idx) < 2 and not big):
        return {}
    words = {i: tuple(sorted(f.wires[0] for f in circuit.measurements[i].obs.terms[0]))
             for i in idx}
    p = native.abs2(state)
    vals = {}
    if not big:
        v = p @ _sign_matrix(tuple(words[i] for i in idx), n, p.dtype, p.device)
        vals = {i: v[:, j] for j, i in enumerate(idx)}
    else:
        a = n // 2
        pv = p.view(p.shape[0], 2 ** a, 2 ** (n - a))
        for (lo, m, mine, shifted), marg in zip(half_register_words(words, n),
                                                 (pv.sum(2), pv.sum(1))):
            if mine:
                v = marg @ _sign_matrix(shifted, m, p.dtype, p.device)
                vals.update({i: v[:, j] for j, i in enumerate(mine)})
    out = {}
    for i, v in vals.items():
        c = circuit.measurements[i].obs.real_coeffs().to(device=v.device, dtype=v.dtype)[0]
        out[i] = v * c
    return out


def _z_plan(circuit):
    """For a circuit whose measurements are all Z words on a small register: the sign matrix
    ``(2**n, K)`` and the coefficients ``(K,)``; else ``None``."""
    from qdiff.circuits.circuit import memo

    def build():
        ms, n = circuit.measurements, circuit.num_wires
        if not ms or not all(_z_word(m) for m in ms) or (2 ** n) * len(ms) > _SIGN_BUDGET:
            return None
        return tuple(tuple(sorted(f.wires[0] for f in m.obs.terms[0])) for m in ms)
    return memo(circuit, "z_plan", build)


def stacked_expvals(state, circuit):
    """``(B, K)`` expvals when every measurement is a Z word on a small register (one
    ``|psi|^2`` pass and one matmul), else ``None``."""
    words = _z_plan(circuit)
    if words is None or any(m.obs.coeffs.requires_grad for m in circuit.measurements):
        return None
    # coefficients are read on every call: an observable may be changed in place
    coeffs = [float(m.obs.real_coeffs()[0]) for m in circuit.measurements]
    p = native.abs2(state)
    v = p @ _sign_matrix(words, circuit.num_wires, p.dtype, p.device)
    if all(c == 1.0 for c in coeffs):
        return v
    return v * torch.tensor(coeffs, dtype=v.dtype, device=v.device)


def measure_all(state, circuit, shots, generator) -> list:
    """One tensor per measurement of ``circuit`` from the final ``state`` ``(B, 2**n)``."""
    n = circuit.num_wires
    out = []
    joint = {} if shots else _joint_z_expvals(state, circuit)
    for i, m in enumerate(circuit.measurements):
        if i in joint:
            out.append(joint[i])
        elif m.kind == "expval":
            out.append(measure.expval(state, m.obs, n) if not shots else
                       measure.sampled_expval(state, m.obs, n, shots, generator))
        elif m.kind == "var":
            out.append(measure.variance(state, m.obs, n) if not shots else
                       measure.sampled_var(state, m.obs, n, shots, generator))
        elif m.kind == "probs":
            p = measure.probs(state, m.wires, n)
            if shots:
                idx = measure.sample_indices(p, shots, generator)
                p = torch.zeros_like(p).scatter_add_(1, idx, torch.ones_like(idx, dtype=p.dtype)) / shots
            out.append(p)
        elif m.kind == "state":
            if shots:
                raise QdiffError("state() is not available with shots")
            out.append(state)
        elif m.kind in ("sample", "counts"):
            if not shots:
                raise QdiffError(f"{m.kind}() needs a device with shots (qd.device(..., shots=N))")
            if m.obs is not None:
                out.append(measure.sample_eigvals(state, m.obs, n, shots, generator))
            else:
                out.append(measure.sample_bits(state, m.wires, n, shots, generator))
        else:  # pragma: no cover - Measurement kinds are fixed
            raise QdiffError(f"unknown measurement '{m.kind}'")
    return out
