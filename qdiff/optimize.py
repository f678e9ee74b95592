"""Quantum natural gradient as a ``torch.optim.Optimizer``.

``theta <- theta - lr * (g + lam I)^-1 grad L`` with ``g`` the Fubini-Study metric of the qnode's
state with respect to the optimized tensors: ``metric="block-diag"`` (default; also runs on
shot backends), ``"diag"``, ``"full"`` (exact, statevector) or ``"spsa"`` (QN-SPSA, Gacon et al.
2021: a rank-2 estimate from four state fidelities per step, averaged over steps - cheap on
hardware, where the block-diagonal metric needs one circuit per layer).

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=1)
>>> @qd.qnode(dev)
... def cost(w):
...     qd.RX(w[0], wires=0); qd.RY(w[1], wires=0)
...     return qd.expval(qd.Z(0))
>>> w = torch.tensor([0.3, 0.2], requires_grad=True)
>>> opt = qd.QNGOptimizer([w], cost, lr=0.1)
>>> for _ in range(40):
...     opt.zero_grad(); loss = cost(w); loss.backward(); _ = opt.step()
>>> round(float(cost(w).detach()), 4)
-1.0
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Callable, Optional

import torch

from qdiff.circuits import memory
from qdiff.circuits.errors import QdiffError
from qdiff.metric import check_angles_only, record_call, theta_metric

METRICS = ("block-diag", "diag", "full", "spsa")


class QNGOptimizer(torch.optim.Optimizer):
    """Quantum natural gradient descent.

    Args:
        params: the tensors to optimize. Each must reach the gate angles of ``qnode``: as an
            argument, or any other way (a tensor the qnode's function closes over, classical
            layers before it; pass ``args=lambda: ()`` for a qnode without arguments), the
            metric being pulled back through that graph. ``metric="spsa"`` perturbs the
            arguments, so there each must be a positional argument.
        qnode: the qnode whose state defines the metric (usually the cost qnode itself).
        lr: step size. lam: Tikhonov regularization added to the metric's diagonal.
        metric: ``"block-diag"``, ``"diag"``, ``"full"`` or ``"spsa"``.
        args: callable returning the qnode's positional arguments (default: ``params`` in order).
        spsa_epsilon, spsa_resamplings, seed: QN-SPSA perturbation size, estimates per step,
            random seed (None: drawn from torch's global generator, so ``torch.manual_seed``
            makes a run reproducible).
    """

    def __init__(self, params, qnode, lr: float = 0.1, lam: float = 1e-3,
                 metric: str = "block-diag", args: Optional[Callable] = None,
                 spsa_epsilon: float = 1e-2, spsa_resamplings: int = 1,
                 seed: Optional[int] = None, **kwargs):
        if kwargs:
            raise QdiffError(f"QNGOptimizer: unknown keyword(s) {sorted(kwargs)}; valid: lr, "
                             "lam, metric, args, spsa_epsilon, spsa_resamplings, seed "
                             "(PennyLane's stepsize is lr, its approx is metric)")
        if metric not in METRICS:
            raise QdiffError(f"QNGOptimizer: metric must be one of {list(METRICS)}; got {metric!r}")
        _check_rates(lr, lam)
        if metric == "spsa":
            if not _real(spsa_epsilon) or not spsa_epsilon > 0 or not math.isfinite(spsa_epsilon):
                raise QdiffError(f"QNGOptimizer: spsa_epsilon must be a finite number > 0; got "
                                 f"{spsa_epsilon!r}")
            if isinstance(spsa_resamplings, bool) or not isinstance(spsa_resamplings, int) \
                    or spsa_resamplings < 1:
                raise QdiffError(f"QNGOptimizer: spsa_resamplings must be an integer >= 1; got "
                                 f"{spsa_resamplings!r}")
        if not (hasattr(qnode, "device") and (callable(getattr(qnode, "construct", None))
                                              or callable(getattr(qnode, "record", None)))):
            record_call(qnode, (), {}, "QNGOptimizer")  # raises, naming the object
        try:
            super().__init__(params, dict(lr=lr, lam=lam))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, QdiffError):
                raise
            raise QdiffError(f"QNGOptimizer: params: {exc}") from None
        self.qnode, self.metric, self.args_fn = qnode, metric, args
        self.spsa_epsilon, self.spsa_resamplings = spsa_epsilon, spsa_resamplings
        # seed=None draws the stream's seed from torch's global generator (torch.manual_seed)
        if seed is None:
            seed = int(torch.randint(0, 2 ** 62, (1,))) if metric == "spsa" else 0
        self._gen = torch.Generator().manual_seed(seed)
        self._spsa_avg, self._spsa_count = None, 0
        self.last_metric: Optional[torch.Tensor] = None

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        _check_rates(self.param_groups[-1]["lr"], self.param_groups[-1]["lam"])

    def state_dict(self):
        """torch's state dict plus the QN-SPSA running metric and random stream, so that a
        loaded optimizer goes on with the same run."""
        out = super().state_dict()
        out["qng"] = {"metric": self.metric, "spsa_avg": self._spsa_avg,
                      "spsa_count": self._spsa_count, "generator": self._gen.get_state()}
        return out

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop("qng", None)
        if extra is not None and extra.get("metric") != self.metric:
            raise QdiffError(f"QNGOptimizer.load_state_dict: the state is that of "
                             f"metric={extra.get('metric')!r}, this optimizer has "
                             f"metric={self.metric!r}")
        super().load_state_dict(state_dict)
        if extra is not None:
            avg = extra["spsa_avg"]
            self._spsa_avg = None if avg is None else avg.clone()
            self._spsa_count = int(extra["spsa_count"])
            self._gen.set_state(extra["generator"].clone())

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def _args(self):
        return tuple(self.args_fn()) if self.args_fn is not None else tuple(self._params())

    def _positions(self, args):
        """``[(offset in the optimized vector, offset in the flattened trainable arguments,
        size)]``, one entry per argument that is an optimized tensor (a tensor passed twice
        has two), and the number of trainable argument entries."""
        train = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        offs, off = [], 0
        for a in train:
            offs.append((a, off))
            off += a.numel()
        out, pos = [], 0
        for p in self._params():
            hit = [o for a, o in offs if a is p]
            if not hit:
                raise QdiffError("QNGOptimizer: an optimized tensor is not a trainable argument "
                                 "of the qnode (pass args=lambda: (...) naming the arguments)")
            out.extend((pos, o, p.numel()) for o in hit)
            pos += p.numel()
        return out, off

    @torch.no_grad()
    def compute_metric(self) -> torch.Tensor:
        """The (unregularized) metric over the optimized tensors, flattened ``(D, D)``, in their
        (promoted) dtype, as ``qd.metric_tensor`` gives it."""
        params = self._params()
        dtype = functools.reduce(torch.promote_types, [p.dtype for p in params])
        return self._metric().to(dtype)

    def _metric(self) -> torch.Tensor:
        """:meth:`compute_metric` in the precision it was computed in (float32 at least)."""
        args = self._args()
        if self.metric != "spsa":
            approx = None if self.metric == "full" else self.metric
            with torch.enable_grad():
                recorded = record_call(self.qnode, args, {})
                check_angles_only(recorded, "QNGOptimizer", " (make it constant)")
                g, cols = theta_metric(recorded, self.qnode.device, approx)
                return self._pull_back(g, cols, recorded)
        idx, total = self._positions(args)
        full = self._spsa_metric(args, total)
        dim = sum(p.numel() for p in self._params())
        g = full.new_zeros(dim, dim)
        for pa, aa, na in idx:  # a tensor passed as several arguments: the sum of its blocks
            for pb, ab, nb in idx:
                g[pa:pa + na, pb:pb + nb] += full[aa:aa + na, ab:ab + nb]
        return g

    def _pull_back(self, g, cols, recorded):
        """``J^T g J`` with ``J = d theta / d params`` read off the recording's autograd graph:
        whichever way a tensor reaches the gate angles (an argument, several arguments, a
        keyword, a tensor the qnode's function closes over, classical layers before it)."""
        if recorded.batch_shape != ():
            raise QdiffError(f"QNGOptimizer: the qnode call is batched (batch shape "
                             f"{recorded.batch_shape}); the metric is of one state")
        params = self._params()
        dim = sum(p.numel() for p in params)
        memory.require(8.0 * (len(cols) * dim + dim * dim) * 2,
                       f"the metric tensor over {dim} parameters", g.device)
        J = g.new_zeros(len(cols), dim)
        reached = [False] * len(params)
        theta = recorded.theta[0, cols]
        if theta.requires_grad:
            for r in range(len(cols)):
                grads = torch.autograd.grad(theta[r], params, retain_graph=True,
                                            allow_unused=True)
                off = 0
                for k, (p, d) in enumerate(zip(params, grads)):
                    if d is not None:
                        J[r, off:off + p.numel()] = d.reshape(-1).to(J.dtype)
                        reached[k] = True
                    off += p.numel()
        if not all(reached):
            raise QdiffError("QNGOptimizer: an optimized tensor is not a trainable argument of "
                             "the qnode and does not reach its gate angles (pass "
                             "args=lambda: (...) naming the arguments)")
        return J.T @ g[0] @ J

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            _check_rates(group["lr"], group["lam"])
        params = self._params()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        g = self._metric()
        self.last_metric = g.to(flat.dtype)
        # solved in the metric's precision (float32 at least: torch has no float16 solver);
        # each step is rounded to its parameter's dtype
        work = torch.promote_types(torch.promote_types(g.dtype, flat.dtype), torch.float32)
        g, flat = g.to(work), flat.to(work)
        # each group's own lam on the diagonal entries of its parameters
        lam = torch.cat([torch.full((p.numel(),), float(group["lam"]), dtype=g.dtype)
                         for group in self.param_groups for p in group["params"]]).to(g.device)
        memory.require(8.0 * 4 * flat.numel() ** 2,
                       f"the natural-gradient solve over {flat.numel()} parameters", g.device)
        reg = g + torch.diag(lam)
        delta = torch.linalg.solve(reg, flat) if bool((lam > 0).all()) \
            else torch.linalg.pinv(reg) @ flat
        off = 0
        for group in self.param_groups:
            for p in group["params"]:
                k = p.numel()
                p.add_(delta[off:off + k].reshape(p.shape).to(p.dtype), alpha=-group["lr"])
                off += k
        return loss

    # -- QN-SPSA ------------------------------------------------------------------------------
    def _spsa_metric(self, args, total):
        train = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        # in float64: the estimate divides fidelity differences by 2 eps**2
        base = torch.cat([args[i].detach().reshape(-1).to(torch.float64) for i in train])
        with torch.enable_grad():
            check_angles_only(record_call(self.qnode, args, {}), "QNGOptimizer(metric='spsa')",
                              " (make it constant)")
        eps = self.spsa_epsilon
        memory.require(8.0 * 6 * total * total,
                       f"the QN-SPSA metric estimate over {total} parameters")
        est = torch.zeros(total, total, dtype=base.dtype)
        for _ in range(self.spsa_resamplings):
            d1 = (torch.randint(0, 2, (total,), generator=self._gen) * 2 - 1).to(base.dtype)
            d2 = (torch.randint(0, 2, (total,), generator=self._gen) * 2 - 1).to(base.dtype)
            shifts = torch.stack([d1 + d2, d1, -d1 + d2, -d1]) * eps
            f = fidelities(self.qnode, args, train, base, shifts)
            df = f[0] - f[1] - f[2] + f[3]
            hess = df / (2 * eps ** 2) * 0.5 * (torch.outer(d1, d2) + torch.outer(d2, d1))
            est += -0.5 * hess
        est /= self.spsa_resamplings
        k = self._spsa_count
        self._spsa_avg = est if self._spsa_avg is None else (k * self._spsa_avg + est) / (k + 1)
        self._spsa_count += 1
        vals, vecs = torch.linalg.eigh(self._spsa_avg)
        return (vecs * vals.abs()) @ vecs.T  # sqrt(g g): the nearest positive semidefinite


def _real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_rates(lr, lam) -> None:
    if not (_real(lr) and math.isfinite(lr) and lr > 0):
        raise QdiffError(f"QNGOptimizer: lr must be a finite number > 0; got {lr!r}")
    if not (_real(lam) and math.isfinite(lam) and lam >= 0):
        raise QdiffError(f"QNGOptimizer: lam must be a finite number >= 0; got {lam!r}")


def _with_flat(args, train, flat):
    out, off = list(args), 0
    for i in train:
        a = args[i]
        out[i] = flat[off:off + a.numel()].reshape(a.shape).to(a.dtype)
        off += a.numel()
    return out


def fidelities(qnode, args, train, base, shifts):
    """``|<psi(base)|psi(base + shift_k)>|^2`` for each row of ``shifts`` ``(K, D)``: ``(K,)``.

    Noiseless statevector backends: from the states. Other backends (shots, hardware, noisy
    or mixed-state devices): one compute-uncompute circuit per shift, all K bindings in one
    ``execute`` call (one hardware job), read off P(0...0); with a device noise model that
    circuit is routed for the device (:mod:`qdiff.noise`) like any other.
    """
    rec0 = record_call(qnode, _with_flat(args, train, base), {})
    recs = [record_call(qnode, _with_flat(args, train, base + s), {}) for s in shifts]
    thetas = torch.cat([r.theta.detach() for r in recs])
    dev = qnode.device
    pure = getattr(dev, "noise", None) is None and getattr(dev, "name", "") != "mixed"
    if pure and dev.capabilities.backprop and not getattr(dev, "shots", None):
        from qdiff.circuits.measurements import Measurement
        circ = rec0.circuit.with_measurements([Measurement("state", None, None)])
        with torch.no_grad():
            (a,) = dev.run(circ, rec0.theta.detach(), rec0.initial_state)
            (b,) = dev.run(circ, thetas, rec0.initial_state)
        return ((a.conj() * b).sum(-1).abs() ** 2).real.cpu().to(torch.float64)
    if rec0.initial_state is not None:
        raise QdiffError("QN-SPSA fidelities on a sampling backend need circuits that start "
                         "from |0...0> (no StatePrep/AmplitudeEmbedding)")
    circ = _overlap_circuit(rec0.circuit)
    theta = torch.cat([rec0.theta.detach().expand(len(recs), -1), thetas], dim=1)
    from qdiff.noise import route_circuit
    circ, theta = route_circuit(circ, theta, dev)
    (p,) = dev.run(circ, theta, rec0.initial_state)
    return p[:, 0].detach().cpu().to(torch.float64)


def _overlap_circuit(circuit):
    """``U(theta_b)^dagger U(theta_a)`` with ``theta = [theta_a, theta_b]`` and probs measured."""
    from qdiff.circuits.circuit import Circuit
    from qdiff.circuits.measurements import Measurement
    from qdiff.circuits.operation import Operation, ParamRef
    P = circuit.num_params

    def shift(op):
        return Operation(op.gate, op.wires, tuple(
            ParamRef(q.index + P, q.scale, q.offset) if isinstance(q, ParamRef) else q
            for q in op.params))
    inv = [shift(op).inverse() for op in reversed(circuit.operations)]
    return Circuit(circuit.num_wires, tuple(circuit.operations) + tuple(inv),
                   (Measurement("probs", None, None),), 2 * P, circuit.wire_labels)
