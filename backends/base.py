"""The Backend protocol: the one door between qdiff's core and every engine.

A backend runs :class:`Job` s. A job is shaped like a Qiskit EstimatorV2 PUB: one circuit, ``B``
parameter bindings ``theta`` ``(B, P)``, and the circuit's measurements saying what to return.
``execute(jobs)`` returns one :class:`Result` per job (one hardware job may carry them all);
engines with their own reverse mode also offer ``vjp(jobs, cotangents, residuals)``, which
receives the residuals their forward ``execute`` kept (``Job.keep``): whatever the backward
needs travels from forward to backward explicitly, never through module state.

>>> import torch, qdiff as qd
>>> from qdiff.backends.base import Job
>>> dev = qd.device("statevector", wires=1)
>>> c = qd.Circuit(1, (qd.Operation(qd.get_gate("rx"), (0,), (qd.ParamRef(0),)),),
...                (qd.expval(qd.Z(0)),), num_params=1)
>>> [res] = dev.execute([Job(c, torch.tensor([[0.0], [3.14159265358979]]))])
>>> res.outputs[0].round()
tensor([ 1., -1.], dtype=torch.float64)
>>> dev.capabilities.backprop, dev.capabilities.vjp
(True, True)
"""
from __future__ import annotations

import abc
import numbers
import threading
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, Union

import torch

from qdiff.circuits.errors import QdiffError
from qdiff.circuits.memory import require

DEVICE_SHOTS = "device"  # Job.shots: use the backend's own setting


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; the differentiation rules (:mod:`qdiff.rules`) read this.

    ``backprop``: torch autograd flows through ``execute``. ``vjp``: the backend has its own
    reverse mode (``vjp``), differentiating the output kinds in ``vjp_kinds``. ``fast_vjp``: that
    reverse mode is the fastest exact gradient at every size (``diff_method="best"`` then picks
    it over backprop); otherwise ``best`` prefers backprop up to ``backprop_max_wires``.
    ``stochastic``: results are Monte Carlo estimates even without shots (noise by
    trajectories): finite differences take the sampled step, as with shots.
    ``call_shots``: a job may ask for shots other than the device's (else they are the
    device's setting only).
    """

    backprop: bool = False
    vjp: bool = False
    shots: bool = True
    exact: bool = True
    vjp_kinds: tuple = ("expval", "var", "probs")
    fast_vjp: bool = False
    backprop_max_wires: int = 16
    stochastic: bool = False
    call_shots: bool = True


@dataclass(frozen=True, eq=False)
class Job:
    """One unit of work: ``circuit`` for the ``B`` bindings ``theta`` ``(B, P)``.

    Args:
        circuit: a :class:`~qdiff.circuits.Circuit`; its measurements say what to return.
        theta: real ``(B, P)`` parameter bindings.
        initial_state: optional ``(B or 1, 2**n)`` complex start state (default ``|0...0>``).
        shots: ``"device"`` (the backend's setting), ``None`` (exact) or a positive int.
        flat: return the outputs as ONE real ``(B, K)`` tensor (expval/var/probs only, in
            measurement order) instead of one tensor per measurement.
        keep: keep the residual a later ``vjp`` of this job needs (``Result.residual``).
        trainable: per theta column, whether ``vjp`` must return its gradient (None: all).
        shared: per theta column, True when the column is one value broadcast over the batch
            by construction; ``vjp`` may then return its gradient as partial sums over rows.
    """

    circuit: Any
    theta: torch.Tensor
    initial_state: Optional[torch.Tensor] = None
    shots: Union[str, int, None] = DEVICE_SHOTS
    flat: bool = False
    keep: bool = False
    trainable: Optional[tuple] = None
    shared: Optional[tuple] = None


@dataclass
class Result:
    """``outputs``: one tensor per measurement with leading dim ``B`` (or one ``(B, K)`` tensor
    for a ``flat`` job); ``residual``: what ``vjp`` needs (opaque; only for ``keep`` jobs)."""

    outputs: Union[list, torch.Tensor]
    residual: Any = None


MAX_DEVICE_WIRES = 100_000  # far above any simulable or existing register; bounds the labels


def normalize_device_wires(wires) -> tuple:
    """A device's wire labels from ``wires``: an int (or a 0-d integer tensor or array) ``n``
    gives ``0..n-1``; a string is one label; otherwise a sequence of distinct hashable labels
    (0-d integer tensors among them become ints)."""
    if isinstance(wires, bool):
        raise QdiffError(f"wires must be an int or a sequence of labels; got {wires!r}")
    if getattr(wires, "ndim", None) == 0 and hasattr(wires, "item"):  # a 0-d tensor or array
        item = wires.item()
        if isinstance(item, bool) or not isinstance(item, numbers.Integral):
            raise QdiffError(f"wires must be an int or a sequence of labels; got {wires!r}")
        wires = int(item)
    if isinstance(wires, numbers.Integral):
        if wires < 1:
            raise QdiffError(f"a device needs at least one wire; got wires={wires}")
        if wires > MAX_DEVICE_WIRES:
            raise QdiffError(f"wires={wires}: a device has at most {MAX_DEVICE_WIRES} wires")
        return tuple(range(int(wires)))
    if isinstance(wires, str):  # one label, as for an operation's wires
        return (wires,)
    size = len(wires) if hasattr(wires, "__len__") else None
    if size is not None and size > MAX_DEVICE_WIRES:
        raise QdiffError(f"{size} wire labels: a device has at most {MAX_DEVICE_WIRES} wires")
    if isinstance(wires, torch.Tensor):
        wires = wires.tolist()  # Python numbers, not 0-d tensors (hashed by identity)
    try:
        labels = tuple(_device_label(w) for w in wires)
    except TypeError:
        raise QdiffError(f"wires must be an int or a sequence of labels; got {wires!r}") from None
    if len(set(labels)) != len(labels):
        raise QdiffError(f"device wires contain duplicates: {list(labels)}")
    if not labels:
        raise QdiffError("a device needs at least one wire")
    return labels


def _device_label(w):
    """One device wire label: hashable; a 0-d integer tensor becomes its int."""
    if isinstance(w, torch.Tensor):
        if w.ndim == 0 and not (w.is_floating_point() or w.is_complex() or
                                w.dtype == torch.bool):
            return int(w)
        raise QdiffError(f"device wire label {w!r}: a tensor label must be a 0-d integer "
                         "tensor; labels are ints, strings or other hashable values")
    try:
        hash(w)
    except TypeError:
        raise QdiffError(f"device wire label {w!r} is not hashable ({type(w).__name__}); "
                         "labels are ints, strings or other hashable values, wires a flat "
                         "sequence of them") from None
    return w


MAX_SEED = 2 ** 64 - 1  # torch generators take 64-bit seeds


def check_seed(seed, what: str = "seed"):
    """``None`` or a non-negative integer up to ``2**64 - 1`` (numpy's rule, within torch's
    64-bit generators); ``True`` and other non-integers are refused."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or \
            not 0 <= seed <= MAX_SEED:
        raise QdiffError(f"{what} must be a non-negative integer (at most 2**64 - 1) or None; "
                         f"got {seed!r}")
    return int(seed)


def check_shots(shots, what: str = "shots"):
    """``None`` or a positive int (``True`` and other non-integers are refused)."""
    if shots is None:
        return None
    if isinstance(shots, bool) or not isinstance(shots, numbers.Integral) or shots < 1:
        hint = ("; a shot vector goes to the qnode or the call (qd.qnode(dev, shots=[...]), "
                "f(x, shots=[...]))" if isinstance(shots, (list, tuple)) else "")
        raise QdiffError(f"{what} must be a positive integer or None; got {shots!r}{hint}")
    return int(shots)


MAX_SHOT_PARTITIONS = 100_000


def shot_vector(shots):
    """The partitions of a shot vector (a list or tuple of positive ints and ``(shots,
    copies)`` pairs, as PennyLane's), flattened to a tuple of ints; ``None`` for anything that
    is not a sequence (a single setting, checked elsewhere)."""
    if not isinstance(shots, (list, tuple)):
        return None
    def positive(v, what):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise QdiffError(f"{what} in a shot vector must be a positive integer; got {v!r}")
        return int(v)

    out = []
    for entry in shots:
        if isinstance(entry, (list, tuple)):
            if len(entry) != 2:
                raise QdiffError(f"shot vector entry {entry!r}: give shots or (shots, copies)")
            n, copies = positive(entry[0], "shots"), positive(entry[1], "copies")
        else:
            n, copies = positive(entry, "shots"), 1
        if len(out) + copies > MAX_SHOT_PARTITIONS:
            raise QdiffError(f"shot vector of more than {MAX_SHOT_PARTITIONS} partitions")
        out += [n] * copies
    if not out:
        raise QdiffError("empty shot vector")
    return tuple(out)


TORCH_DTYPES = {torch.complex128: torch.complex128, torch.complex64: torch.complex64,
                torch.float64: torch.complex128, torch.float32: torch.complex64,
                "complex128": torch.complex128, "complex64": torch.complex64}


def torch_placement(dtype, device) -> tuple:
    """``(complex dtype, torch.device or None)`` of a torch engine from its ``dtype=`` and
    ``device=`` options, checked (an unknown dtype or device, or CUDA where there is none, is a
    ``QdiffError``)."""
    if dtype not in TORCH_DTYPES:
        raise QdiffError(f"dtype must be complex128 or complex64 (float64 and float32 name the "
                         f"same precisions); got {dtype}")
    try:
        torch_device = torch.device(device) if device is not None else None
    except RuntimeError as exc:
        raise QdiffError(f"invalid torch device {device!r}: {exc}") from None
    if torch_device is not None and torch_device.type == "meta":
        raise QdiffError(f"device={device!r}: meta tensors hold no values to simulate; use "
                         "'cpu' or 'cuda'")
    if torch_device is not None and torch_device.type == "cuda" and not torch.cuda.is_available():
        raise QdiffError(f"device={device!r}: no CUDA device is available here (use 'cpu')")
    if torch_device is not None and torch_device.type != "cpu":
        try:  # any other device type (mps, xpu, ...) or index: it must hold a tensor here
            torch.empty(0, device=torch_device)
        except (RuntimeError, AssertionError, ValueError) as exc:
            raise QdiffError(f"device={device!r}: no {torch_device.type} device is available "
                             "here (torch cannot allocate a tensor on it); use 'cpu'") from None
    return TORCH_DTYPES[dtype], torch_device


_GENERATOR_LOCK = threading.Lock()  # makes a backend's shot generator once


def global_generator(device) -> Optional[torch.Generator]:
    """Torch's global generator on ``device`` (CPU or CUDA; None for another device type): the
    draws of an unseeded device or rule, so that ``torch.manual_seed`` repeats them and the
    worker processes of a ``DataLoader``, which torch reseeds one by one, draw apart (a
    generator of its own, made before a fork, would give every child the same draws)."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        torch.cuda.init()
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return None


class Backend(abc.ABC):
    """Base class: holds wires, shots and the seed; engines implement :meth:`execute`."""

    name = "backend"
    capabilities = Capabilities()

    def __init__(self, wires, shots: Optional[int] = None, seed: Optional[int] = None):
        self.wires = normalize_device_wires(wires)
        shots = check_shots(shots)
        if shots is None and not self.capabilities.exact:
            raise QdiffError(f"backend '{self.name}' needs shots")
        if shots is not None and not self.capabilities.shots:
            raise QdiffError(f"backend '{self.name}' does not support shots")
        self.shots = shots
        self.seed = check_seed(seed)
        self._generator = None

    def generator(self, device) -> torch.Generator:
        """The backend's random generator on ``device``: seeded by ``seed=`` when given, kept
        across calls so that successive shot draws differ. Threads sharing the backend draw
        from one generator, made once (two first calls at once would otherwise each start the
        seed's stream: the same shots twice). Without a seed, torch's global generator of that
        device (:func:`global_generator`)."""
        if self.seed is None:
            g = global_generator(device)
            if g is not None:
                return g
        g = self._generator
        if g is None or g.device != torch.device(device):
            with _GENERATOR_LOCK:
                g = self._generator
                if g is None or g.device != torch.device(device):
                    g = torch.Generator(device=device)
                    if self.seed is not None:
                        g.manual_seed(int(self.seed))
                    else:
                        g.seed()
                    self._generator = g
        return g

    @property
    def num_wires(self) -> int:
        return len(self.wires)

    @abc.abstractmethod
    def execute(self, jobs: Sequence[Job]) -> list:
        """One :class:`Result` per job, in order."""

    def check_batch(self, batch: int, num_params: int) -> None:
        """Refuse (``QdiffMemoryError``), before a qnode assembles theta ``(B, P)``, a batch
        whose execution would not fit: theta itself and, on a backend that holds the states of
        the whole batch in this process (``capabilities.backprop``: the torch engine), four
        states per binding (the simulator's own minimum)."""
        need = 8.0 * batch * num_params
        what = f"the parameters of a batch of {batch} bindings"
        if self.capabilities.backprop:
            item = getattr(self, "cdtype", torch.complex128).itemsize
            need += 4.0 * batch * item * 2.0 ** self.num_wires
            what = f"simulating {self.num_wires} qubits with batch {batch}"
        require(need, what, getattr(self, "torch_device", None))

    def vjp(self, jobs: Sequence[Job], cotangents: Sequence[torch.Tensor],
            residuals: Sequence) -> list:
        """``(B, P)`` vector-Jacobian products of the jobs' flat outputs with ``cotangents``
        ``(B, K)``, by the backend's own reverse mode (``capabilities.vjp``)."""
        raise QdiffError(f"backend '{self.name}' has no reverse mode of its own (vjp); use "
                         "diff_method='parameter-shift'")

    def vjp_suits(self, circuit) -> bool:
        """Whether the backend's own reverse mode suits one binding of ``circuit``: it fits the
        memory budget and costs no more than backprop (``diff_method="best"`` takes backprop
        where it does not)."""
        return True

    def prepare(self, job: Job) -> "Prepared":
        """``job`` with its structure fixed (circuit, batch size, trainable and shared columns,
        initial state): the returned :class:`Prepared` runs it for new bindings ``theta``.
        Engines may override this to do their per-structure work once; the default runs
        :meth:`execute` and :meth:`vjp` with the job's fields."""
        return Prepared(self, job)

    def run(self, circuit, theta: Optional[torch.Tensor] = None, initial_state=None,
            shots=DEVICE_SHOTS) -> list:
        """One job: one tensor per measurement, each with leading dim ``B`` (``theta``
        ``(B, P)``; may be left out for a circuit without parameters)."""
        from qdiff.circuits.circuit import Circuit
        if not isinstance(circuit, Circuit):
            raise QdiffError(f"{self.name}.run: expected a qdiff Circuit; got "
                             f"{type(circuit).__name__} (a Qiskit circuit runs as "
                             "qd.qnode(dev)(qc)(values), or through qdiff.primitives)")
        if theta is None:
            if circuit.num_params:
                raise QdiffError(f"{self.name}.run: the circuit has {circuit.num_params} "
                                 "parameter(s); give theta (B, P)")
            theta = torch.zeros(1, 0, dtype=torch.float64)
        return self.execute([Job(circuit, theta, initial_state, shots)])[0].outputs

    def job_shots(self, job: Job):
        """The shots a job runs with (its own, or the backend's)."""
        if job.shots == DEVICE_SHOTS:
            return self.shots
        return check_shots(job.shots)

    def __repr__(self):
        shots = f", shots={self.shots}" if self.shots else ""
        return f"<{type(self).__name__} wires={self.num_wires}{shots}>"


class Prepared:
    """A job of fixed structure (:meth:`Backend.prepare`), run for new bindings.

    ``execute(theta, keep)`` returns the job's :class:`Result` for ``theta`` ``(B, P)`` (``B``
    the prepared batch size); ``vjp(theta, cotangent, residual)`` the ``(B, P)`` gradient, with
    the residual an ``execute(..., keep=True)`` of the same object returned (or ``None``)."""

    def __init__(self, backend: "Backend", job: Job):
        self.backend, self.job = backend, job

    @property
    def batch(self) -> int:
        return int(self.job.theta.shape[0])

    def execute(self, theta: torch.Tensor, keep: bool = False) -> Result:
        return self.backend.execute([replace(self.job, theta=theta, keep=keep)])[0]

    def vjp(self, theta: torch.Tensor, cotangent: torch.Tensor, residual) -> torch.Tensor:
        return self.backend.vjp([replace(self.job, theta=theta, keep=False)], [cotangent],
                                [residual])[0]

    def bind(self, gather: "Gather") -> Optional["Bound"]:
        """A :class:`Bound` runner that reads the angles straight from the argument tensors
        (``gather``) and returns their gradients, or ``None`` when the engine has none for this
        job (the caller then gathers ``theta`` itself and uses :meth:`execute` / :meth:`vjp`)."""
        return None


@dataclass(frozen=True)
class Gather:
    """How a record-once caller binds the angles: ``theta[b, j] = scale[b, j] * src[idx[b, j]]
    + offset[b, j]`` (``scale``/``offset`` ``None``: 1 and 0), ``src`` the flattened argument
    tensors concatenated, then ``consts``. ``sizes``: each argument's number of elements;
    ``needs``: whether its gradient is wanted."""

    idx: torch.Tensor
    scale: Optional[torch.Tensor]
    offset: Optional[torch.Tensor]
    consts: Optional[torch.Tensor]
    sizes: tuple
    needs: tuple


class Bound(abc.ABC):
    """A prepared job bound to a :class:`Gather`: ``run(tensors, keep)`` returns the flat
    float64 outputs ``(B, K)`` and (``keep``) the residual; ``grad(tensors, residual,
    cotangent)`` the gradient of ``sum(cotangent * outputs)`` per argument tensor (float64 of
    the argument's shape, ``None`` where not wanted), consuming the residual. The residual
    holds everything the run read from the tensors: with one, ``grad`` gets ``tensors=None``;
    without one (``None``) it runs again from ``tensors``."""

    @abc.abstractmethod
    def run(self, tensors, keep: bool) -> tuple:
        ...

    @abc.abstractmethod
    def grad(self, tensors, residual, cotangent: torch.Tensor) -> list:
        ...


def flat_outputs(outputs: list) -> torch.Tensor:
    """One real ``(B, K)`` tensor from per-measurement outputs (expval/var/probs)."""
    return torch.cat([o.reshape(o.shape[0], -1) for o in outputs], dim=-1)


_REGISTRY: dict = {}


def register_backend(*names):
    """Class decorator: make a backend available to ``qd.device(name)`` under ``names``."""
    def deco(factory):
        for n in names:
            _REGISTRY[n] = factory
        return factory
    return deco


def registered() -> dict:
    """``{name: factory}`` of the backends registered so far."""
    return dict(_REGISTRY)
