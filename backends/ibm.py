"""``qd.device("ibm", backend=NAME, ...)``: IBM Quantum hardware through qiskit-ibm-runtime, or
any fake (noisy, offline) device it ships, through its local testing mode.

* ``NAME`` starting with ``fake_`` (``fake_manila``, ``fake_sherbrooke``, ... see
  :func:`fake_backend_names`) runs offline with that device's noise model: the fake backend is
  passed as the primitives' ``mode``.
* Any other name is a real device: a ``QiskitRuntimeService`` is created from ``token=`` /
  ``instance=`` / ``channel=``, else the ``QISKIT_IBM_TOKEN`` / ``QISKIT_IBM_INSTANCE`` /
  ``QISKIT_IBM_CHANNEL`` environment variables, else the account saved with
  ``QiskitRuntimeService.save_account``. The token is never stored on the backend, and is
  scrubbed from every error message.

Circuits are transpiled to the device's ISA once per structure (preset pass manager) and
observables follow the layout. Expectations go out as ONE Estimator job per execute() (one PUB
with a ``(B, 1, P)`` parameter array and ``(1, K)`` observables): qiskit-ibm-runtime's client-side
``executor_estimator.Estimator`` where it exists (error mitigation options passed through; it
mitigates in local mode too), else ``EstimatorV2``. ``probs``/``sample``/``counts`` use a Sampler
job.

>>> import qdiff as qd
>>> dev = qd.device("ibm", backend="fake_manila", wires=2, shots=1000)
>>> dev
<IbmBackend fake_manila wires=2, shots=1000, mode='job'>
"""
from __future__ import annotations

import difflib
import os
import threading
import warnings
from typing import Optional

from qdiff.circuits import caches
from qdiff.backends import qiskit_common as qc_common
from qdiff.backends.base import Capabilities, register_backend
from qdiff.backends.qiskit_backend import QiskitBackend, assemble, split_variants
from qdiff.backends.runtime_jobs import JobRunner, is_transient
from qdiff.circuits.errors import QdiffError, register_secret, scrub
from qdiff.circuits.memory import require

MODES = ("job", "batch", "session")
_MODE_LOCK = threading.Lock()  # publishes a device's Batch/Session once; close() takes it
# Local mode with the executor primitives simulates every device qubit, shot by shot under the
# device's noise: a 16-qubit fake takes ~45 s per 1000 shots, a 27-qubit one over 200 s and
# ~5 GB for 10 shots. Larger local devices run the V2 primitives, which drop idle qubits.
LOCAL_EXECUTOR_MAX_QUBITS = 16
# The executor primitives twirl and dress with these gates: a device whose target lacks them
# (the u1/u2/u3 fakes: fake_essex, fake_almaden, ...) fails inside samplomatic or Aer.
EXECUTOR_GATES = ("rz", "sx", "x")


@caches.cached(maxsize=1)
def _fake_provider():
    import warnings
    from qiskit_ibm_runtime.fake_provider import FakeProviderForBackendV2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fake_nighthawk warns about its made-up error values
        return FakeProviderForBackendV2()


@caches.cached(maxsize=1)
def _fake_table() -> dict:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {b.name: b for b in _fake_provider().backends()}


def fake_backend_names(max_qubits: Optional[int] = None) -> list:
    """Names of every fake backend qiskit-ibm-runtime ships (``fake_manila``, ...)."""
    return sorted(n for n, b in _fake_table().items()
                  if max_qubits is None or b.num_qubits <= max_qubits)


def fake_backend(name: str):
    """The fake backend called ``name`` (a ``FakeBackendV2``), or a QdiffError naming close ones."""
    table = _fake_table()
    key = name.lower()
    if key not in table:
        close = difflib.get_close_matches(key, table, n=3)
        hint = f"; did you mean {close}?" if close else ""
        raise QdiffError(f"unknown fake IBM backend '{name}'{hint} (all fake backends: "
                         "qd.backends.available('ibm'))")
    return table[key]


def offline_hint(name: str) -> str:
    """Where to run offline instead of the real device ``name``: its fake twin
    (``ibm_brisbane`` -> ``fake_brisbane``) if qiskit-ibm-runtime ships one, else close fake
    names."""
    table = _fake_table()
    key = str(name).lower()
    twin = "fake_" + (key[4:] if key.startswith("ibm_") else key)
    if twin in table:
        return (f"; to run offline, backend='{twin}' is the noisy fake twin of '{name}' "
                f"({table[twin].num_qubits} qubits, its noise model)")
    close = difflib.get_close_matches(twin, table, n=3)
    listed = f" (close: {close})" if close else ""
    return (f"; to run offline, use a fake device{listed}: all are listed by "
            "qd.backends.available('ibm')")


def runtime_service(token: Optional[str] = None, instance: Optional[str] = None,
                    channel: Optional[str] = None, hint: str = ""):
    """A ``QiskitRuntimeService`` from arguments, environment variables or a saved account
    (``hint`` ends a failure's message)."""
    from qiskit_ibm_runtime import QiskitRuntimeService
    token = token or os.environ.get("QISKIT_IBM_TOKEN") or None
    instance = instance or os.environ.get("QISKIT_IBM_INSTANCE") or None
    channel = channel or os.environ.get("QISKIT_IBM_CHANNEL") or None
    register_secret(token)
    kwargs = {k: v for k, v in (("channel", channel), ("token", token), ("instance", instance))
              if v is not None}
    try:
        service = QiskitRuntimeService(**kwargs)
    except Exception as exc:  # noqa: BLE001 - mapped to a clear, token-free message
        message = _service_error(exc, token is not None)
    else:
        # a token from the saved account is as secret as one passed in
        register_secret(getattr(getattr(service, "_account", None), "token", None))
        return service
    # raised outside the handler: the error keeps no __context__ (the original exception,
    # whose text may hold the token)
    raise QdiffError(message + hint)


def _service_error(exc: BaseException, had_token: bool) -> str:
    name = type(exc).__name__
    detail = scrub(exc)
    if name == "AccountNotFoundError" or (not had_token and "account" in detail.lower()):
        return ("no IBM Quantum account found: set QISKIT_IBM_TOKEN (and QISKIT_IBM_INSTANCE, "
                "optionally QISKIT_IBM_CHANNEL), pass token=... to qd.device('ibm', ...), or "
                "save one with QiskitRuntimeService.save_account(...)")
    if is_transient(exc):
        return f"could not reach IBM Quantum ({name}): {detail}"
    return (f"IBM Quantum did not accept the account (invalid or expired token, wrong instance "
            f"or channel, or the service is unreachable): {name}: {detail}")


def _as_dict(keyword: str, value, enabled_key: dict) -> Optional[dict]:
    """``True``/``False``/dict option -> dict (``enabled_key`` is what ``True`` means)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return {k: value for k in enabled_key}
    if isinstance(value, dict):
        return dict(value)
    raise QdiffError(f"{keyword} must be True, False or a dict of options; got {value!r}")


def _primitive_options(keyword: str, value) -> dict:
    """``estimator_options``/``sampler_options``: a dict without the options that have a
    keyword of their own (that keyword would be silently overridden)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise QdiffError(f"{keyword} must be a dict of primitive options; got "
                         f"{type(value).__name__}")
    if "default_shots" in value:
        raise QdiffError(f"{keyword}={{'default_shots': ...}}: pass it as "
                         "qd.device('ibm', ..., shots=...) instead")
    if isinstance(value.get("simulator"), dict) and "seed_simulator" in value["simulator"]:
        raise QdiffError(f"{keyword}={{'simulator': {{'seed_simulator': ...}}}}: pass it as "
                         "qd.device('ibm', ..., seed=...) instead")
    return dict(value)


# options the V2 primitives' local testing mode uses (everything else it ignores, warning)
_LOCAL_V2_OPTIONS = ("default_shots", "default_precision", "simulator", "run_options")


def local_executor_obstacle(backend) -> Optional[str]:
    """Why the executor primitives cannot simulate ``backend`` in local mode, or None."""
    nq = backend.num_qubits
    if nq > LOCAL_EXECUTOR_MAX_QUBITS:
        return (f"has {nq} qubits, and the executor primitives' local mode simulates every one "
                f"(hours and gigabytes beyond {LOCAL_EXECUTOR_MAX_QUBITS})")
    names = set(getattr(getattr(backend, "target", None), "operation_names", ()) or ())
    missing = [g for g in EXECUTOR_GATES if g not in names]
    if missing:
        return (f"lacks the gates {missing} that the executor primitives twirl with (its basis "
                f"is {sorted(n for n in names if n not in ('delay', 'measure', 'reset'))})")
    return None


def _close_quietly(mode_obj) -> None:
    """Close a Batch/Session no job was sent through; a failure is a warning, not the run's."""
    try:
        mode_obj.close()
    except Exception as exc:  # noqa: BLE001
        message = (f"could not close an unused {type(mode_obj).__name__}: "
                   f"{type(exc).__name__}: {scrub(exc)}")
    else:
        return
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _is_on(value) -> bool:
    """An option that asks for something: a true value, or a dict holding one."""
    if isinstance(value, dict):
        return any(_is_on(v) for v in value.values())
    return bool(value)


def _merge(into: dict, extra: dict) -> dict:
    for k, v in (extra or {}).items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
    return into


@register_backend("ibm", "qiskit.ibm", "ibm_runtime")
class IbmBackend(QiskitBackend):
    """IBM Quantum device (real, with an account) or fake device (offline, noisy).

    Args:
        wires: number of wires or their labels (at most the device's qubit count).
        backend: a device name (``"ibm_brisbane"``, ``"fake_manila"``) or a Qiskit backend.
        shots: shots per PUB (``default_shots`` of the primitives); 4096 by default.
        optimization_level: preset pass manager level (0-3).
        mode: ``"job"`` (default), ``"batch"`` or ``"session"`` (not on every plan).
        resilience_level: Estimator resilience level (0 none, 1 readout/TREX, 2 ZNE);
            None keeps the primitive's default.
        resilience, twirling, dynamical_decoupling: option dicts (``True`` enables) passed
            to the primitives.
        estimator_options, sampler_options: further options, deep-merged last.
        primitive: ``"auto"`` (executor Estimator/Sampler if installed, else the V2 ones;
            V2 for local devices the executor cannot simulate, see
            :func:`local_executor_obstacle`), ``"executor"`` or ``"v2"``.
        token, instance, channel: account for a real device (else env vars / saved account).
        seed: local-mode simulator seed.
        timeout, max_retries, backoff, progress: job handling (see ``JobRunner``).
    """

    name = "ibm"
    capabilities = Capabilities(backprop=False, vjp=False, shots=True, exact=False,
                                call_shots=False)

    def __init__(self, wires, backend=None, shots: Optional[int] = 4096,
                 optimization_level: int = 2, mode: str = "job",
                 resilience_level: Optional[int] = None, resilience: Optional[dict] = None,
                 twirling=None, dynamical_decoupling=None, estimator_options=None,
                 sampler_options=None, primitive: str = "auto", token: Optional[str] = None,
                 instance: Optional[str] = None, channel: Optional[str] = None,
                 seed: Optional[int] = None, timeout: Optional[float] = None,
                 max_retries: int = 3, backoff: float = 1.0, progress="auto", service=None):
        if backend is None:
            raise QdiffError("qd.device('ibm', ...) needs backend=NAME (a device such as "
                             "'ibm_brisbane', or a fake one such as 'fake_manila')")
        if mode not in MODES:
            raise QdiffError(f"mode must be one of {list(MODES)}; got {mode!r}")
        if primitive not in ("auto", "executor", "v2"):
            raise QdiffError(f"primitive must be 'auto', 'executor' or 'v2'; got {primitive!r}")
        if isinstance(optimization_level, bool) or optimization_level not in (0, 1, 2, 3):
            raise QdiffError(f"optimization_level must be 0..3; got {optimization_level!r}")
        if resilience_level is not None and (isinstance(resilience_level, bool) or
                                             resilience_level not in (0, 1, 2)):
            raise QdiffError(f"resilience_level must be 0 (none), 1 (TREX) or 2 (ZNE) or None; "
                             f"got {resilience_level!r}")
        self.target_backend, self.is_local = self._resolve(backend, token, instance, channel,
                                                           service)
        self.backend_name = str(getattr(self.target_backend, "name", backend))
        runner = JobRunner(f"ibm {self.backend_name}", timeout=timeout, max_retries=max_retries,
                           backoff=backoff, progress=progress)
        super().__init__(wires, shots, seed, runner)
        nq = self.target_backend.num_qubits
        if self.num_wires > nq:
            raise QdiffError(f"too many qubits: {self.num_wires} wires requested but "
                             f"'{self.backend_name}' has {nq}")
        self.optimization_level, self.mode, self.primitive = optimization_level, mode, primitive
        self.options = {"resilience_level": resilience_level, "resilience": resilience,
                        "twirling": _as_dict("twirling", twirling,
                                             {"enable_gates": 1, "enable_measure": 1}),
                        "dynamical_decoupling": _as_dict("dynamical_decoupling",
                                                         dynamical_decoupling, {"enable": 1})}
        self.extra_options = {
            "estimator": _primitive_options("estimator_options", estimator_options),
            "sampler": _primitive_options("sampler_options", sampler_options)}
        self._mode_obj = None
        if self.is_local:
            self._check_local_options()

    def _check_local_options(self):
        """A fake device checks its options now, not at the first run: the primitives are
        built (unknown options are refused), and the V2 primitives' local mode, which ignores
        mitigation options, refuses them instead."""
        from qiskit_ibm_runtime import EstimatorV2
        if self._primitive_class("estimator") is EstimatorV2:
            ignored = sorted({k for kind in ("estimator", "sampler")
                              for k, v in self.primitive_options(kind).items()
                              if k not in _LOCAL_V2_OPTIONS and _is_on(v)})
            if ignored:
                why = ("primitive='v2'" if self.primitive == "v2" else
                       f"'{self.backend_name}' "
                       f"{local_executor_obstacle(self.target_backend)}, so it runs the V2 "
                       "primitives")
                raise QdiffError(f"ibm {self.backend_name}: {ignored} would have no effect: "
                                 f"{why}, whose local testing mode ignores them; drop them "
                                 "or use a fake device of at most "
                                 f"{LOCAL_EXECUTOR_MAX_QUBITS} qubits with the gates "
                                 f"{list(EXECUTOR_GATES)} and the executor primitives")
        self._make("estimator")
        self._make("sampler")

    @staticmethod
    def _resolve(backend, token, instance, channel, service):
        if not isinstance(backend, str):
            if not (hasattr(backend, "target") and hasattr(backend, "num_qubits")):
                raise QdiffError(f"backend={backend!r:.60}: expected an IBM backend name "
                                 "('ibm_...', 'fake_...') or a Qiskit BackendV2 object; got "
                                 f"{type(backend).__name__}")
            from qiskit_ibm_runtime import IBMBackend
            # a runtime backend of an account runs remotely; any other object (a fake device,
            # an AerSimulator) runs here, seeded
            return backend, not isinstance(backend, IBMBackend)
        if backend.lower().startswith("fake_"):
            return fake_backend(backend), True
        hint = offline_hint(backend)
        service = service or runtime_service(token, instance, channel, hint=hint)
        try:
            return service.backend(backend), False
        except Exception as exc:  # noqa: BLE001
            message = (f"could not reach IBM Quantum to look up '{backend}': {scrub(exc)}"
                       if is_transient(exc) else
                       f"unknown IBM backend '{backend}' for this account "
                       f"({type(exc).__name__}: {scrub(exc)})")
        # outside the handler: no __context__ holding the token
        raise QdiffError(message + hint)

    def __getstate__(self):
        """A fake device pickles as any Qiskit device; a device on a real IBM backend is
        refused: its backend object holds the account service and its token, which
        ``torch.save(model)`` would write into the file."""
        if not self.is_local:
            raise QdiffError(f"ibm {self.backend_name}: a device on a real IBM backend is not "
                             "pickled (its backend object holds the account's token); save the "
                             "model's state_dict and create the device again where it is "
                             "loaded")
        return super().__getstate__()

    def __deepcopy__(self, memo):
        """A copy (``copy.deepcopy`` of a model) that shares the runtime objects holding the
        account (the backend, its service and session) and copies the rest."""
        import copy
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        state = QiskitBackend.__getstate__(self)
        shared = {k: state.pop(k) for k in ("target_backend", "_mode_obj") if k in state}
        new.__dict__.update(copy.deepcopy(state, memo))
        new.__dict__.update(shared)
        return new

    def __repr__(self):
        return (f"<IbmBackend {self.backend_name} wires={self.num_wires}, shots={self.shots}, "
                f"mode={self.mode!r}>")

    # -- execution modes ---------------------------------------------------------------------
    def execution_mode(self):
        """The ``mode=`` object handed to the primitives: the backend, a Batch or a Session.
        The Batch/Session opens on first use; threads sharing the device share it: two that
        both find none open one each, the first is kept and the other closed at once."""
        if self.mode == "job":
            return self.target_backend
        held = self._mode_obj
        if held is None:
            built = self._open_mode()
            with _MODE_LOCK:
                if self._mode_obj is None:
                    self._mode_obj = built
                held = self._mode_obj
            if held is not built:
                _close_quietly(built)
        return held

    def _open_mode(self):
        from qiskit_ibm_runtime import Batch, Session
        cls = Batch if self.mode == "batch" else Session
        message = None
        try:
            return cls(backend=self.target_backend)
        except Exception as exc:  # noqa: BLE001
            message = (f"could not open a {self.mode} on '{self.backend_name}': "
                       f"{type(exc).__name__}: {scrub(exc)}")
        raise QdiffError(message)  # outside the handler: no __context__

    def close(self):
        """Close an open Batch/Session (no-op in job mode). Jobs already submitted through it
        run to completion; a later run on the device opens a new one."""
        with _MODE_LOCK:
            held, self._mode_obj = self._mode_obj, None
        if held is not None:
            held.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- hooks -----------------------------------------------------------------------------
    def _transpile(self, qc):
        def make():
            from qiskit.transpiler import generate_preset_pass_manager
            return generate_preset_pass_manager(optimization_level=self.optimization_level,
                                                backend=self.target_backend,
                                                seed_transpiler=self.seed)
        return self.pass_manager(make).run(qc)

    def primitive_options(self, kind: str) -> dict:
        """Options dict for the ``kind`` (``"estimator"``/``"sampler"``) primitive."""
        opts = {"default_shots": self.shots}
        for key, val in self.options.items():
            if val is not None and (kind == "estimator" or not key.startswith("resilience")):
                opts[key] = val
        if self.seed is not None and self.is_local:
            opts["simulator"] = {"seed_simulator": self.run_seed()}
        return _merge(opts, self.extra_options[kind])

    def _primitive_class(self, kind: str):
        # qiskit-ibm-runtime 0.51's executor primitives make Aer simulate every qubit of a
        # fake device in local mode, and fail on devices without rz/sx/x; the V2 ones truncate
        # idle qubits and run any basis. "auto" therefore picks V2 for such local devices, and
        # an explicit "executor" is refused for them.
        obstacle = local_executor_obstacle(self.target_backend) if self.is_local else None
        if self.primitive == "executor" and obstacle is not None:
            raise QdiffError(f"ibm {self.backend_name}: primitive='executor' cannot run this "
                             f"device locally: it {obstacle}; use primitive='auto' or 'v2'")
        if self.primitive == "executor" or (self.primitive == "auto" and obstacle is None):
            try:
                if kind == "estimator":
                    from qiskit_ibm_runtime.executor_estimator import Estimator as cls
                else:
                    from qiskit_ibm_runtime.executor_sampler import Sampler as cls
                return cls
            except ImportError:
                if self.primitive == "executor":
                    raise QdiffError("primitive='executor' needs qiskit-ibm-runtime >= 0.50 "
                                     "(executor_estimator); use primitive='v2'") from None
        from qiskit_ibm_runtime import EstimatorV2, SamplerV2
        return EstimatorV2 if kind == "estimator" else SamplerV2

    def _make(self, kind: str):
        import warnings
        cls = self._primitive_class(kind)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # EstimatorV2 on 0.50+
            try:
                return cls(mode=self.execution_mode(), options=self.primitive_options(kind))
            except QdiffError:
                raise
            except Exception as exc:  # noqa: BLE001 - bad options, mostly
                message = (f"ibm {self.backend_name}: could not create the {kind} "
                           f"({type(exc).__name__}: {scrub(exc)})")
        raise QdiffError(message)  # outside the handler: no __context__

    def _estimator(self):
        return self._make("estimator")

    def _sampler(self):
        return self._make("sampler")

    # -- execution -------------------------------------------------------------------------
    def _execute(self, circuit, theta, initial_state=None) -> list:
        """At most two jobs: one Estimator job (expval/var) and one Sampler job (probs/samples)."""
        theta = self.check_circuit(circuit, theta)
        qc_common.check_measurements(circuit, self.name)
        batch = theta.shape[0]
        variants = split_variants(circuit, batch, initial_state)
        ops = qc_common.measured_operators(circuit)
        merged = [(v.rows, {}) for v in variants]
        if ops and self.is_local:
            # local mode simulates every shot: ~128 bytes per shot, binding and basis (measured)
            flat = [op for _, g in ops for op in g]
            nbases = max(1, len(qc_common.qwc_bases(flat, circuit.num_wires)[0]))
            require(128.0 * self.shots * batch * nbases,
                    f"ibm {self.backend_name}: the local simulation of {self.shots} shots x "
                    f"{batch} bindings x {nbases} measurement bases",
                    hint="use fewer shots or a smaller batch")
        if ops:
            for (rows, res), (_, part) in zip(merged, self.run_estimator(circuit, theta,
                                                                         variants, ops)):
                res.update(part)
        plan = qc_common.SamplingPlan(circuit, [])
        if plan.bases:
            for (rows, res), (_, part) in zip(merged, self.run_sampling(circuit, theta,
                                                                        variants, plan)):
                res.update(part)
        return assemble(merged, circuit, batch, theta)
