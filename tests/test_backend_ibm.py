"""qd.device("ibm"): fake devices offline (local testing mode, noisy), the real-device path as far
as it goes without network (service from env vars, clear errors, the token never shown)."""
from __future__ import annotations

import logging

import pytest
import torch

import qdiff as qd
from qdiff import QdiffError

TOKEN = "qdiff-test-TOKEN-0123456789abcdef"
# Noisy small fake devices: expectations of <= 3-qubit, <= 4-CNOT circuits stay within this of
# the ideal value (readout/gate errors of fake_manila with TREX, 4000 shots).
NOISY_ATOL = 0.15


@pytest.fixture
def no_account(monkeypatch, tmp_path):
    """No env credentials and an empty home: no saved account can be found."""
    for var in ("QISKIT_IBM_TOKEN", "QISKIT_IBM_INSTANCE", "QISKIT_IBM_CHANNEL", "QISKIT_IBM_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    import qiskit_ibm_runtime.accounts.management as mgmt
    monkeypatch.setattr(mgmt, "_DEFAULT_ACCOUNT_CONFIG_JSON_FILE",
                        str(tmp_path / ".qiskit" / "qiskit-ibm.json"))


def test_available_lists_every_shipped_fake_backend():
    from qiskit_ibm_runtime.fake_provider import FakeProviderForBackendV2
    names = qd.backends.available("ibm")
    expected = sorted(b.name for b in FakeProviderForBackendV2().backends())
    assert names == expected
    assert {"fake_manila", "fake_sherbrooke", "fake_lima", "fake_nairobi"} <= set(names)
    assert "ibm" in qd.backends.available("devices")


def test_unknown_fake_backend_suggests_a_name():
    with pytest.raises(QdiffError, match=r"unknown fake IBM backend 'fake_manilla'.*fake_manila"):
        qd.device("ibm", backend="fake_manilla", wires=2)


def test_too_many_qubits():
    with pytest.raises(QdiffError, match="too many qubits: 6 wires.*'fake_manila' has 5"):
        qd.device("ibm", backend="fake_manila", wires=6)


def test_backend_is_required_and_options_checked():
    with pytest.raises(QdiffError, match="needs backend=NAME"):
        qd.device("ibm", wires=2)
    with pytest.raises(QdiffError, match="mode must be one of"):
        qd.device("ibm", backend="fake_lima", wires=2, mode="eternal")
    with pytest.raises(QdiffError, match="needs shots"):
        qd.device("ibm", backend="fake_lima", wires=2, shots=None)


def _routed(x):
    """X on wires 1 and 3 and a CNOT triangle that forces SWAPs on a line-shaped device."""
    qd.PauliX(1)
    qd.PauliX(3)
    qd.RY(x, wires=0)
    qd.CNOT([0, 2])
    qd.CNOT([2, 4])
    qd.CNOT([4, 0])
    return [qd.expval(qd.Z(w)) for w in range(5)]


def test_observables_follow_the_layout_one_job():
    dev = qd.device("ibm", backend="fake_manila", wires=5, shots=4000, seed=3,
                    optimization_level=3)
    x = torch.tensor([0.0, 3.0], dtype=torch.float64)
    got = qd.qnode(dev)(_routed)(x)
    ref = qd.qnode(qd.device("statevector", wires=5))(_routed)(x)
    assert got.shape == (2, 5)
    assert (got - ref).abs().max() < 2 * NOISY_ATOL  # 5-qubit routed circuit: looser
    assert (got.sign() == ref.sign()).all()  # a misplaced observable would flip signs
    assert dev.jobs_submitted == 1


@pytest.mark.parametrize("primitive", ["executor", "v2"])
def test_expectations_close_to_ideal_and_cached(primitive):
    def f(x, w):
        qd.RY(x, wires=0)
        qd.RX(w, wires=1)
        qd.CNOT([0, 1])
        return [qd.expval(qd.Z(0) @ qd.Z(1)), qd.expval(0.5 * qd.X(0) - qd.Z(1)),
                qd.var(qd.Z(1))]
    x = torch.tensor([0.2, 1.4, 2.9], dtype=torch.float64)
    w = torch.tensor([0.5, -0.3, 1.0], dtype=torch.float64)
    dev = qd.device("ibm", backend="fake_lima", wires=2, shots=4000, seed=1, primitive=primitive)
    ref = qd.qnode(qd.device("statevector", wires=2))(f)(x, w)
    got = qd.qnode(dev)(f)(x, w)
    assert (got - ref).abs().max() < NOISY_ATOL
    qd.qnode(dev)(f)(x + 0.1, w)
    assert dev.jobs_submitted == 2
    assert dev.transpile_cache.misses == 1 and dev.transpile_cache.hits == 1


def test_executor_options_are_passed_through():
    dev = qd.device("ibm", backend="fake_lima", wires=1, resilience_level=2, twirling=True,
                    dynamical_decoupling={"enable": True, "sequence_type": "XY4"},
                    estimator_options={"twirling": {"num_randomizations": 8}}, seed=4)
    opts = dev.primitive_options("estimator")
    assert opts["resilience_level"] == 2 and opts["default_shots"] == 4096
    assert opts["twirling"] == {"enable_gates": True, "enable_measure": True,
                                "num_randomizations": 8}
    assert opts["dynamical_decoupling"]["sequence_type"] == "XY4"
    seeds = [opts["simulator"]["seed_simulator"],
             dev.primitive_options("estimator")["simulator"]["seed_simulator"]]
    assert seeds[0] != seeds[1]  # each run its own draw of the seeded generator
    twin = qd.device("ibm", backend="fake_lima", wires=1, seed=4)
    assert [twin.primitive_options("estimator")["simulator"]["seed_simulator"]
            for _ in range(2)] == seeds
    assert "resilience_level" not in dev.primitive_options("sampler")
    est = dev._estimator()
    assert type(est).__module__.startswith("qiskit_ibm_runtime.executor_estimator")
    assert est.options.resilience_level == 2
    with pytest.raises(QdiffError, match="could not create the estimator"):
        qd.device("ibm", backend="fake_lima", wires=1, estimator_options={"no_such": 1})
    with pytest.raises(QdiffError, match="could not create the sampler"):
        qd.device("ibm", backend="fake_lima", wires=1, sampler_options={"no_such": 1})


@pytest.mark.parametrize("kwargs, message", [
    ({"optimization_level": True}, "optimization_level must be 0..3; got True"),
    ({"resilience_level": True}, "resilience_level must be 0 .* got True"),
    ({"resilience_level": 3}, "resilience_level must be 0 .* got 3"),
    ({"twirling": "yes"}, "twirling must be True, False or a dict"),
    ({"dynamical_decoupling": 1}, "dynamical_decoupling must be True, False or a dict"),
    ({"estimator_options": [1]}, "estimator_options must be a dict"),
    ({"estimator_options": {"default_shots": 10}}, "pass it as .*shots="),
    ({"sampler_options": {"default_shots": 10}}, "pass it as .*shots="),
    ({"estimator_options": {"simulator": {"seed_simulator": 3}}}, "pass it as .*seed="),
    ({"primitive": "v2", "resilience_level": 1}, r"\['resilience_level'\] would have no effect"),
    ({"primitive": "v2", "twirling": True, "dynamical_decoupling": True},
     r"\['dynamical_decoupling', 'twirling'\] would have no effect"),
])
def test_options_that_would_be_ignored_or_overridden_are_refused(kwargs, message):
    """The device's shots and seed are the ones used; the V2 primitives' local mode ignores
    mitigation options (a Qiskit warning only), so a fake device refuses them."""
    with pytest.raises(QdiffError, match=message):
        qd.device("ibm", backend="fake_lima", wires=1, **kwargs)


def test_v2_local_mode_without_mitigation_runs():
    dev = qd.device("ibm", backend="fake_lima", wires=1, primitive="v2", twirling=False,
                    resilience_level=0, shots=100, seed=1)
    got = qd.qnode(dev)(lambda: qd.expval(qd.Z(0)))()
    assert float(got) > 0.8


def test_probs_and_counts_through_the_sampler():
    def f():
        qd.PauliX(0)
        return qd.probs(wires=[0, 1])
    dev = qd.device("ibm", backend="fake_quito", wires=2, shots=2000, seed=2, mode="batch")
    p = qd.qnode(dev)(f)()
    assert p.shape == (4,) and abs(float(p.sum()) - 1) < 1e-12 and float(p[2]) > 0.85
    c = qd.qnode(dev)(lambda: (qd.PauliX(1), qd.counts(wires=[0, 1]))[1])()
    assert sum(c.values()) == 2000 and max(c, key=c.get) == "01"
    dev.close()


def test_parameter_shift_training_step_is_two_jobs():
    dev = qd.device("ibm", backend="fake_manila", wires=2, shots=2000, seed=5,
                    resilience_level=0)

    @qd.qnode(dev, diff_method="parameter-shift")
    def f(x, w):
        qd.RY(x, wires=0)
        qd.RY(w[0], wires=1)
        qd.CNOT([0, 1])
        qd.RX(w[1], wires=1)
        return qd.expval(qd.Z(1))
    x = torch.tensor([0.1, 0.8, -0.5], dtype=torch.float64)
    w = torch.tensor([0.3, 0.6], dtype=torch.float64, requires_grad=True)
    f(x, w).sum().backward()
    assert dev.jobs_submitted == 2  # forward + all 4 shifts x 3 inputs in one PUB
    ww = w.detach().clone().requires_grad_()
    ref = qd.qnode(qd.device("statevector", wires=2), diff_method="backprop")(f.func)
    ref(x, ww).sum().backward()
    assert (w.grad - ww.grad).abs().max() < 0.35  # noisy, 2000 shots, sums of 3 gradients


# -- the real-device path, offline -------------------------------------------------------------


def test_missing_account_is_a_clear_error(no_account):
    with pytest.raises(QdiffError, match="no IBM Quantum account found: set QISKIT_IBM_TOKEN") \
            as info:
        qd.device("ibm", backend="ibm_brisbane", wires=2)
    assert "backend='fake_brisbane' is the noisy fake twin of 'ibm_brisbane'" in str(info.value)
    with pytest.raises(QdiffError, match="no IBM Quantum account found") as info:
        qd.device("ibm", backend="ibm_nowhere_like", wires=2)  # no twin: where fakes are listed
    assert "qd.backends.available('ibm')" in str(info.value)


class RecordingService:
    """Stands in for QiskitRuntimeService: records how it was created."""

    created: list = []

    def __init__(self, **kwargs):
        RecordingService.created.append(kwargs)

    def backend(self, name):
        from qiskit_ibm_runtime.fake_provider import FakeQuitoV2
        if name != "ibm_quito_like":
            raise KeyError(f"No backend matches the criteria: {name}")
        return FakeQuitoV2()


def test_service_from_environment_variables(monkeypatch, no_account, caplog):
    import qiskit_ibm_runtime
    monkeypatch.setattr(qiskit_ibm_runtime, "QiskitRuntimeService", RecordingService)
    monkeypatch.setenv("QISKIT_IBM_TOKEN", TOKEN)
    monkeypatch.setenv("QISKIT_IBM_INSTANCE", "crn:v1:my-instance")
    monkeypatch.setenv("QISKIT_IBM_CHANNEL", "ibm_quantum_platform")
    RecordingService.created.clear()
    with caplog.at_level(logging.DEBUG):
        dev = qd.device("ibm", backend="ibm_quito_like", wires=2)
        with pytest.raises(QdiffError) as info:
            qd.device("ibm", backend="ibm_nowhere", wires=2)
    assert RecordingService.created[0] == {"channel": "ibm_quantum_platform", "token": TOKEN,
                                           "instance": "crn:v1:my-instance"}
    assert not dev.is_local and dev.backend_name == "fake_quito"
    assert "unknown IBM backend 'ibm_nowhere'" in str(info.value)
    assert "to run offline" in str(info.value)
    for text in (repr(dev), str(vars(dev)), str(info.value), caplog.text):
        assert TOKEN not in text


def test_rejected_token_never_appears(no_account, caplog):
    """A real QiskitRuntimeService with a made-up token: no network here, so it fails; the
    message is clear and the token is nowhere in it, its cause chain or the logs."""
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(QdiffError) as info:
            qd.device("ibm", backend="ibm_brisbane", wires=2, token=TOKEN,
                      channel="ibm_quantum_platform")
    msg = str(info.value)
    assert "did not accept the account" in msg or "could not reach IBM Quantum" in msg
    assert "backend='fake_brisbane' is the noisy fake twin" in msg
    assert TOKEN not in msg and TOKEN not in caplog.text
    assert info.value.__cause__ is None and info.value.__context__ is None


def _chain_text(exc) -> str:
    """Every message, repr and argument along an exception's __cause__/__context__ chain."""
    out, seen, todo = [], set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out += [str(e), repr(e), repr(e.args)]
        todo += [e.__cause__, e.__context__]
    return "\n".join(out)


class LeakyService:
    """A service whose failures quote the token (as an HTTP error echoing a request might)."""

    def __init__(self, token=None, **kwargs):
        if kwargs.get("instance") == "refused":
            raise ValueError(f"token {token} refused")
        self.token = token

    def backend(self, name):
        raise KeyError(f"no backend {name} for token {self.token}")


@pytest.mark.parametrize("how", ["keyword", "environment"])
@pytest.mark.parametrize("instance", ["refused", "accepted"])
def test_token_is_not_in_the_error_chain(monkeypatch, no_account, caplog, how, instance):
    import qiskit_ibm_runtime
    monkeypatch.setattr(qiskit_ibm_runtime, "QiskitRuntimeService", LeakyService)
    kwargs = {"token": TOKEN} if how == "keyword" else {}
    if how == "environment":
        monkeypatch.setenv("QISKIT_IBM_TOKEN", TOKEN)
    with caplog.at_level(logging.DEBUG), pytest.raises(QdiffError) as info:
        qd.device("ibm", backend="ibm_x", wires=2, instance=instance, **kwargs)
    assert TOKEN not in _chain_text(info.value) and TOKEN not in caplog.text
    assert "***" in str(info.value)


def test_saved_account_token_is_scrubbed(monkeypatch, no_account):
    """No token given: the service found one in the saved account; it is scrubbed too."""
    import types
    import qiskit_ibm_runtime
    saved = "qdiff-saved-account-TOKEN-fedcba9876"

    class SavedAccountService(LeakyService):
        def __init__(self, **kwargs):
            super().__init__(token=saved)
            self._account = types.SimpleNamespace(token=saved)

    monkeypatch.setattr(qiskit_ibm_runtime, "QiskitRuntimeService", SavedAccountService)
    with pytest.raises(QdiffError, match="unknown IBM backend 'ibm_x'") as info:
        qd.device("ibm", backend="ibm_x", wires=2)
    assert saved not in _chain_text(info.value)


@pytest.mark.slow
def test_large_fake_device_runs_one_job():
    """127-qubit fake device in local mode: slow (noise model of the whole device)."""
    dev = qd.device("ibm", backend="fake_sherbrooke", wires=2, shots=1000, seed=1,
                    resilience_level=0)
    got = qd.qnode(dev)(lambda x: (qd.RY(x, wires=0), qd.CNOT([0, 1]),
                                   qd.expval(qd.Z(1)))[2])(torch.tensor([0.0, 3.0]))
    assert dev.jobs_submitted == 1
    assert (got - torch.cos(torch.tensor([0.0, 3.0]))).abs().max() < NOISY_ATOL


def test_quantum_layer_trains_on_a_fake_device_with_two_jobs_per_step():
    """Linear -> QuantumLayer (fake_manila, noisy, shots) -> Linear, trained with Adam: the
    loss falls and every step (forward + backward) costs at most two runtime jobs."""
    torch.manual_seed(0)
    # EstimatorV2 (no client-side mitigation) keeps this test fast; the executor Estimator
    # path is the same code (test_expectations_close_to_ideal_and_cached)
    dev = qd.device("ibm", backend="fake_manila", wires=2, shots=1000, seed=7, primitive="v2")

    @qd.qnode(dev)
    def circuit(inputs, weights):
        qd.AngleEmbedding(inputs, wires=range(2))
        qd.BasicEntanglerLayers(weights, wires=range(2))
        return [qd.expval(qd.Z(0)), qd.expval(qd.Z(1))]
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), qd.QuantumLayer(circuit, {"weights": (1, 2)}),
                                torch.nn.Linear(2, 1)).double()
    x = torch.rand(4, 2, dtype=torch.float64) * 2 - 1
    y = (x[:, :1] * x[:, 1:] > 0).to(torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    losses, jobs = [], []
    for _ in range(3):
        before = dev.jobs_submitted
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().item())
        jobs.append(dev.jobs_submitted - before)
    with torch.no_grad():
        final = float(torch.nn.functional.mse_loss(model(x), y))
    assert jobs == [2, 2, 2]
    assert final < losses[0], (losses, final)


@pytest.mark.slow
def test_vqe_h2_on_fake_manila_reaches_20_mha():
    """examples/vqe_h2_ibm_fake.py: noisy shots, TREX during training, ZNE for the final
    estimate; within 20 mHa of the exact energy, two jobs per step (about 1-2 minutes)."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "vqe_h2_ibm_fake.py"
    spec = importlib.util.spec_from_file_location("vqe_h2_ibm_fake", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.run("fake_manila", steps=8, verbose=False)
    assert abs(out["final_error_mha"]) < 20
    assert out["jobs_per_step"] == 2 and out["jobs"] == 17


def test_auto_primitive_uses_v2_on_large_fake_devices():
    """Local executor primitives simulate every device qubit; auto picks V2 beyond 16."""
    big = qd.device("ibm", backend="fake_sherbrooke", wires=2)
    small = qd.device("ibm", backend="fake_manila", wires=2)
    assert big._primitive_class("estimator").__name__ == "EstimatorV2"
    assert small._primitive_class("estimator").__module__.endswith("executor_estimator.estimator")


@pytest.mark.parametrize("name, why", [
    ("fake_kolkata", r"has 27 qubits.*simulates every one"),
    ("fake_essex", r"lacks the gates \['rz', 'sx', 'x'\].*'u1', 'u2', 'u3'"),
])
def test_fake_devices_the_local_executor_cannot_run_use_v2(name, why):
    """A 27-qubit fake under the executor primitives simulates all 27 qubits shot by shot
    (over 200 s and 5 GB for 10 shots); a u1/u2/u3 fake fails inside them. Auto runs both on
    the V2 primitives, and an explicit primitive='executor' is refused with the reason."""
    dev = qd.device("ibm", backend=name, wires=2, shots=500, seed=2)
    assert dev._primitive_class("estimator").__name__ == "EstimatorV2"
    assert dev._primitive_class("sampler").__name__ == "SamplerV2"

    @qd.qnode(dev)
    def f():
        qd.PauliX(0)
        return qd.expval(qd.Z(0) @ qd.Z(1)), qd.probs(wires=[0, 1])
    zz, probs = f()
    assert float(zz) < -1 + NOISY_ATOL and float(probs[2]) > 1 - NOISY_ATOL
    with pytest.raises(QdiffError, match=f"primitive='executor' cannot run this device "
                                         f"locally: it {why}"):
        qd.device("ibm", backend=name, wires=2, primitive="executor")
    with pytest.raises(QdiffError, match=f"'resilience_level'.*no effect.*'{name}' {why}"):
        qd.device("ibm", backend=name, wires=2, resilience_level=1)


def test_large_shot_counts_are_checked_against_memory_before_the_job():
    """Local mode simulates every shot (about 128 bytes each per binding and basis): 10**10
    shots are refused before any job is submitted, instead of filling the memory."""
    from qdiff import QdiffMemoryError
    dev = qd.device("ibm", backend="fake_lima", wires=1, shots=10 ** 10, seed=1)
    with pytest.raises(QdiffMemoryError, match="local simulation of 10000000000 shots x 2 "
                                               "bindings x 2 measurement bases"):
        qd.qnode(dev)(lambda x: (qd.RY(x, wires=0), [qd.expval(qd.Z(0)),
                                                      qd.expval(qd.X(0))])[1])(
            torch.tensor([0.1, 0.2]))
    assert dev.jobs_submitted == 0


def test_a_real_device_is_not_pickled_with_its_token():
    """A device on a real backend holds the account service (and its token) in its backend
    object: pickling it (torch.save of a model) is refused without naming the token; a
    deepcopy shares that object; a fake device pickles."""
    import copy
    import pickle
    dev = qd.device("ibm", backend="fake_lima", wires=1, shots=100, seed=1)
    assert pickle.loads(pickle.dumps(dev)).backend_name == dev.backend_name

    class Service:
        token = "SECRET-TOKEN-123"

    class Backend:
        name = "ibm_real"
        num_qubits = 5
        service = Service()
    dev.target_backend, dev.is_local, dev.backend_name = Backend(), False, "ibm_real"
    with pytest.raises(QdiffError, match="not pickled") as info:
        pickle.dumps(dev)
    assert "SECRET" not in str(info.value)
    twin = copy.deepcopy(dev)
    assert twin is not dev and twin.target_backend is dev.target_backend
    assert twin.shots == dev.shots and twin.runner is not dev.runner


def test_a_local_backend_object_is_seeded_and_a_foreign_object_refused():
    """A Qiskit backend object that is not an account's runtime backend (an AerSimulator, a
    fake device) runs locally: seeded, reproducible and picklable; something that is not a
    backend is refused by name."""
    import pickle

    from qiskit_aer import AerSimulator

    def f(x):
        qd.RY(x, wires=0)
        qd.CNOT(wires=[0, 1])
        return qd.probs(wires=[0, 1])
    outs = []
    for _ in range(2):
        dev = qd.device("ibm", backend=AerSimulator(), wires=2, shots=200, seed=123)
        outs.append(qd.qnode(dev)(f)(torch.tensor(1.0, dtype=torch.float64)))
    assert dev.is_local and torch.equal(outs[0], outs[1])
    pickle.dumps(dev)
    for bad in (42, object(), ["fake_manila"]):
        with pytest.raises(qd.QdiffError, match="expected an IBM backend name"):
            qd.device("ibm", backend=bad, wires=2)


def test_observables_with_only_zero_coefficients_are_zero():
    """``Z - Z`` or ``0 * X`` is 0, as on the other devices (the estimators refuse such an
    observable as empty): it is left out of the job, and a call with only such observables
    submits none."""
    dev = qd.device("ibm", backend="fake_manila", wires=2, shots=500, seed=1)

    @qd.qnode(dev)
    def f(x):
        qd.RX(x, wires=0)
        qd.PauliX(1)
        return (qd.expval(qd.Z(0) - qd.Z(0)), qd.expval(qd.Z(1)), qd.var(0.0 * qd.X(0)),
                qd.expval(0.0 * qd.Z(1) + 2.0 * qd.Identity(0)))
    zero, z1, var0, two = f(torch.tensor(0.3, dtype=torch.float64))
    assert float(zero) == 0.0 and float(var0) == 0.0
    assert float(z1) < -1 + NOISY_ATOL and float(two) == pytest.approx(2.0, abs=NOISY_ATOL)
    assert dev.jobs_submitted == 1
    only_zero = qd.qnode(dev)(lambda x: (qd.RX(x, wires=0), qd.expval(0.0 * qd.Z(0)))[1])
    assert float(only_zero(torch.tensor(0.3, dtype=torch.float64))) == 0.0
    assert dev.jobs_submitted == 1


def test_threads_sharing_a_session_device_leave_no_session_open(monkeypatch):
    """Threads sharing a ``mode="session"`` device: two that both find no Session open one
    each; the first published serves every job and the other is closed at once (no Session
    left open on the account). ``close()`` (and leaving ``with``) closes the kept one once,
    even when another thread closes the device meanwhile."""
    import threading

    import qiskit_ibm_runtime

    class Backend:
        name = "ibm_stub"
        num_qubits = 5

    class Service:
        def backend(self, name):
            return Backend()

    opened, got = [], []

    def in_thread(fn):
        t = threading.Thread(target=fn)
        t.start()
        t.join()

    class StubSession:
        def __init__(self, backend):
            self.closed = 0
            opened.append(self)
            if len(opened) == 1:  # another thread opens and publishes one meanwhile
                in_thread(lambda: got.append(dev.execution_mode()))

        def close(self):
            self.closed += 1
            if self.closed == 1 and self is got[0]:  # another thread closes the device too
                in_thread(dev.close)
    monkeypatch.setattr(qiskit_ibm_runtime, "Session", StubSession)
    with qd.device("ibm", backend="ibm_stub", wires=2, mode="session",
                   service=Service()) as dev:
        first = dev.execution_mode()
        assert len(opened) == 2 and first is got[0] is opened[1]
        assert [s.closed for s in opened] == [1, 0]
        assert dev.execution_mode() is first and len(opened) == 2
    assert [s.closed for s in opened] == [1, 1]
    dev.close()
    assert [s.closed for s in opened] == [1, 1]
