"""The memory model (qdiff.circuits.memory) and the guards that consult it before allocating:
the compiler's verifier, shot sampling, the batch of bindings, the Aer backend."""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.backends.statevector import native
from qdiff.circuits import Circuit, memory
from qdiff.circuits.errors import QdiffError, QdiffMemoryError
from qdiff.circuits.gates import Gate, _controlled_fn, multirz_gate, paulirot_gate
from qdiff.compiler.ops import op
from qdiff.compiler.verify import equivalence

GiB = 2 ** 30


@pytest.fixture
def available(monkeypatch):
    """Pretend the machine has ``set(n)`` bytes available (and a much larger total)."""
    def set_(nbytes):
        monkeypatch.setattr(memory, "_meminfo_available", lambda: int(nbytes))
        monkeypatch.setattr(memory, "_cgroup_room", lambda: None)
    return set_


def test_budget_is_a_margin_of_available_memory(available, monkeypatch):
    available(10 * GiB)
    monkeypatch.delenv("QDIFF_MEMORY_LIMIT", raising=False)
    assert memory.budget() == int(memory.MARGIN * 10 * GiB)
    memory.require(8 * GiB, "eight")
    with pytest.raises(QdiffMemoryError, match=r"^twelve needs about 12 GiB but the memory "
                                                r"budget on cpu is 9 GiB \(90% of the available"):
        memory.require(12 * GiB, "twelve")


def test_env_limit_caps_the_budget(available, monkeypatch):
    available(100 * GiB)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "2G")
    assert memory.budget() == 2 * GiB
    with pytest.raises(QdiffMemoryError, match=r"capped by QDIFF_MEMORY_LIMIT\); try less"):
        memory.require(3 * GiB, "three", hint="try less")
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "lots")
    with pytest.raises(QdiffError, match="QDIFF_MEMORY_LIMIT='lots'"):
        memory.budget()


def test_a_need_just_over_the_budget_does_not_read_as_equal(available, monkeypatch):
    available(100 * GiB)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "2G")
    with pytest.raises(QdiffMemoryError, match=r"needs about 2\.0000002 GiB but the memory "
                                                r"budget on cpu is 2 GiB"):
        memory.require(2 * GiB + 208, "two states and their angles")


def test_small_needs_under_the_env_limit_do_not_read_the_system(monkeypatch):
    """The check sits on per-tape and per-call paths: a need under ``ALWAYS_FITS`` and under
    ``QDIFF_MEMORY_LIMIT`` reads no /proc or cgroup file; one over the limit is refused."""
    def unread():
        raise AssertionError("read the system's memory figures")
    monkeypatch.setattr(memory, "_meminfo_available", unread)
    monkeypatch.setattr(memory, "_cgroup_room", unread)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "4G")
    for _ in range(100):
        memory.require(1024, "a small buffer")
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 100 * GiB)
    monkeypatch.setattr(memory, "_cgroup_room", lambda: None)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1K")
    with pytest.raises(QdiffMemoryError, match=r"^two pages needs about"):
        memory.require(8192, "two pages")


def test_cgroup_room_lowers_available(monkeypatch):
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 50 * GiB)
    monkeypatch.setattr(memory, "_cgroup_room", lambda: 3 * GiB)
    assert memory.available("cpu") == 3 * GiB


def test_nan_need_is_refused():
    with pytest.raises(QdiffMemoryError):
        memory.require(float("nan"), "a broken estimate")


# -- the verifier ---------------------------------------------------------------------------

def wide(n: int) -> Circuit:
    return Circuit(n, (op("h", (0,)), op("cx", (0, n - 1)), op("h", (n - 1,))))


def test_verifier_refuses_a_unitary_check_that_cannot_fit():
    """``--verify unitary`` at 24 qubits used 5.7 GB and minutes, then numpy MemoryError: it
    is refused up front (the unitary check is bounded to 12 qubits)."""
    with pytest.raises(QdiffError, match=r"verifying 24 qubits by unitary would simulate "
                                         r"2\*\*24 columns .*--verify statevector"):
        equivalence(wide(24), wide(24), "unitary")


def test_verifier_refuses_40_qubits_up_front():
    """Raised numpy's 'Unable to allocate 32.0 TiB' with a traceback."""
    with pytest.raises(QdiffMemoryError, match="up to 25 qubits; this circuit has 40"):
        equivalence(wide(40), wide(40))


def test_verifier_fifteen_qubit_unitary_against_a_small_budget(monkeypatch):
    """``--verify unitary`` on a 15-qubit benchmark: 16 GiB per copy of the unitary."""
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "8G")
    with pytest.raises(QdiffError, match="verifying 15 qubits by unitary"):
        equivalence(wide(15), wide(15), "unitary")
    assert equivalence(wide(15), wide(15), "statevector").ok
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1M")
    with pytest.raises(QdiffMemoryError, match="verifying 12 qubits by unitary"):
        equivalence(wide(12), wide(12), "unitary")


def test_auto_verification_downgrades_to_random_states_when_the_unitary_cannot_fit(monkeypatch):
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "100M")
    v = equivalence(wide(12), wide(12))
    assert v.ok and v.method == "statevector"
    monkeypatch.delenv("QDIFF_MEMORY_LIMIT")
    assert equivalence(wide(3), wide(3)).method == "unitary"


def test_verifier_rejects_non_finite_angles():
    """``equivalence(rz(nan), x)`` was ``Verdict(ok=True, infidelity=0.0)``."""
    x = Circuit(1, (op("x", (0,)),))
    with pytest.raises(QdiffError, match="NaN or infinite"):
        equivalence(Circuit(1, (op("rz", (0,), (float("nan"),)),)), x)
    tensor_nan = Circuit(1, (op("rz", (0,), (torch.tensor(float("nan")),)),))
    with pytest.raises(QdiffError, match="verification: gate 'rz' on wires \\[0\\] has the "
                                         "non-finite angle"):
        equivalence(tensor_nan, x)


def test_cli_exit_2_for_a_verification_that_cannot_fit(tmp_path, capsys):
    from qdiff.cli import main
    src = tmp_path / "w40.qasm"
    src.write_text('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[40];\nh q[0];\ncx q[0],q[39];\n')
    assert main(["compile", str(src), "-o", str(tmp_path / "o.qasm")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "40" in err[0] and "--verify none" in err[0]
    assert main(["compile", str(src), "-o", str(tmp_path / "o.qasm"), "--verify", "none"]) == 0


# -- shots, batches, Aer --------------------------------------------------------------------

def run(n, body, **dev_kw):
    return qd.qnode(qd.device("statevector", wires=n, **dev_kw))(body)()


def test_shot_buffers_refused_before_allocating():
    """``shots=10**10`` tried to allocate 80 GB (a raw torch RuntimeError)."""
    def body():
        qd.H(0)
        return qd.sample()
    with pytest.raises(QdiffMemoryError, match=r"sampling 10000000000 shots"):
        run(2, body, shots=10 ** 10)


def test_sampling_above_the_multinomial_limit(monkeypatch):
    """More than 2**24 outcomes raised torch's 'number of categories cannot exceed 2^24';
    the inverse-CDF sampler is checked here against the exact distribution."""
    from qdiff.circuits import measurements
    monkeypatch.setattr(measurements, "_MULTINOMIAL_MAX", 2)

    def body():
        qd.RY(1.0, wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RY(0.4, wires=2)
        return qd.probs(wires=[0, 1, 2])
    exact = run(3, body)
    est = run(3, body, shots=200_000, seed=7)
    assert torch.allclose(est, exact, atol=0.01)
    assert est[2] == 0 and est[5] == 0  # impossible outcomes are never drawn


@pytest.mark.slow
def test_sample_of_25_wires_with_shots():
    def body():
        qd.H(0)
        return qd.sample()
    bits = run(25, body, shots=2000, seed=3)
    assert bits.shape == (2000, 25)
    assert bits[:, 1:].sum() == 0 and 800 < int(bits[:, 0].sum()) < 1200


def test_batch_refused_before_theta_is_materialised(monkeypatch):
    """A batch of 10**8 as an expanded view on 4 qubits reached 4.5 GB RSS first."""
    from qdiff.circuits import circuit as circuit_mod

    def must_not_run(*a, **k):
        raise AssertionError("theta was assembled before the batch was checked")
    monkeypatch.setattr(circuit_mod, "_assemble_theta", must_not_run)
    dev = qd.device("statevector", wires=4)

    @qd.qnode(dev)
    def f(x):
        qd.AngleEmbedding(x, wires=range(4))
        return qd.expval(qd.Z(0))
    x = torch.zeros(1, 4, dtype=torch.float64).expand(10 ** 8, 4)
    with pytest.raises(QdiffMemoryError, match="simulating 4 qubits with batch 100000000"):
        f(x)


def test_aer_guard_uses_available_memory(available):
    """Compared with total memory before: 30 qubits passed on a machine with less free."""
    pytest.importorskip("qiskit_aer")
    available(8 * GiB)
    with pytest.raises(QdiffMemoryError, match=r"aer: 30 qubits with method='automatic' needs "
                                                r"about 16 GiB but the memory budget"):
        qd.device("aer", wires=30)
    qd.device("aer", wires=20)
    qd.device("aer", wires=30, method="matrix_product_state")


def test_engine_guard_is_the_memory_model(available, monkeypatch):
    from qdiff.backends.statevector.simulate import available_memory, check_memory
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1M")
    with pytest.raises(QdiffMemoryError, match="simulating 10 qubits with batch 32"):
        check_memory(10, 32, torch.complex128, "cpu")
    available(3 * GiB + 12345)  # a fixed reading: free memory moves between two real reads
    assert available_memory(torch.device("cpu")) == memory.available("cpu") == 3 * GiB + 12345


def test_many_controls_keep_their_generator_structured(monkeypatch):
    """qd.ctrl over 12 controls: its generator |1..1><1..1| (x) G is kept as (12, G) (the
    shift rule needs its spectrum only; a dense one would be 2**13 x 2**13, 1 GiB), so it runs
    within a 256 MiB budget, value and gradient exact, on the native kernels and on the torch
    kernels (which apply the target's matrix on the control slice), backprop too."""
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "256M")
    dev = qd.device("statevector", wires=13)

    def f(a):
        for w in range(12):
            qd.X(w)
        qd.ctrl(qd.RX(a, wires=12), control=list(range(12)))
        return qd.expval(qd.Z(12))
    for method, native_on in [("parameter-shift", True), ("parameter-shift", False),
                              ("adjoint", False), ("backprop", False)]:
        if native_on and native.library() is None:
            continue
        a = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        with (contextlib.nullcontext() if native_on else native.disabled()):
            y = qd.qnode(dev, diff_method=method)(f)(a)
            y.backward()
        assert abs(float(y) - math.cos(0.3)) < 1e-12
        assert abs(float(a.grad) + math.sin(0.3)) < 1e-12


def test_backprop_of_a_gate_with_14_controls_within_a_small_budget(monkeypatch):
    """RY with 14 controls at n = 16 under backprop (the torch kernels): the target's matrix on
    the control slice, not a dense 2**15 x 2**15 matrix (16 GiB each); value and gradient
    equal parameter-shift's, within a 2 GiB budget."""
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "2G")
    n = 16
    ctr = [w for w in range(15) if w != 7]  # controls above and below the target

    def body(x):
        for w in range(n):
            qd.RY(2.9 if w in ctr else 0.4 + 0.1 * w, wires=w)
        qd.ctrl(qd.RY, control=ctr)(x[0], wires=7)
        qd.ctrl(qd.RY, control=ctr)(x[1], wires=15)
        qd.CNOT(wires=[7, 15])
        return qd.expval(qd.X(7) + qd.Z(15))
    dev = qd.device("statevector", wires=n)
    res = {}
    for method in ("backprop", "parameter-shift"):
        x = torch.tensor([0.6, -1.1], dtype=torch.float64, requires_grad=True)
        y = qd.qnode(dev, diff_method=method)(body)(x)
        res[method] = (y.detach(), torch.autograd.grad(y, x)[0])
    (yb, gb), (yp, gp) = res["backprop"], res["parameter-shift"]
    assert abs(float(yb - yp)) < 1e-12 and torch.allclose(gb, gp, atol=1e-12)
    assert gb.abs().min() > 0.1


def test_dense_gate_matrices_checked_against_the_budget(monkeypatch):
    """A parameterised gate on 10 wires with 8 per-binding angles is 8 dense 1024x1024
    matrices on the torch kernels: the engine states them before it evaluates them; within the
    budget it runs. A controlled gate is its target's matrix on the control slice (no dense
    matrix): it runs within the small budget on both kernels."""
    ry = qd.get_gate("ry")
    wide = Gate("wide_cry", 10, 1, _controlled_fn(ry.matrix_fn, 2, 9), pl_name="WideCRY")
    dev = qd.device("statevector", wires=10)

    def circuit(gate):
        @qd.qnode(dev)
        def f(a):
            for w in range(9):
                qd.X(w)
            gate(a)
            return qd.expval(qd.Z(9))
        return f
    f = circuit(lambda a: qd.ctrl(qd.RY(a, wires=9), control=list(range(9))))
    g = circuit(lambda a: wide(a, wires=list(range(10))))
    a = torch.linspace(0.1, 0.8, 8, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(g(a), torch.cos(a), atol=1e-12)
        monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "128M")
        assert torch.allclose(f(a), torch.cos(a), atol=1e-12)
        with native.disabled():
            assert torch.allclose(f(a), torch.cos(a), atol=1e-12)
            with pytest.raises(QdiffMemoryError, match="the matrices of 1 WideCRY gate"):
                g(a)


# -- gate records, state preparation, gradient rules, the metric -----------------------------

def test_diagonal_unitary_dense_record_refused_up_front():
    """A 20-wire diagonal (16 MiB) asked torch for its 16 TiB dense matrix."""
    with pytest.raises(QdiffMemoryError, match=r"DiagonalQubitUnitary on 20 wires: its dense "
                                                r"1048576x1048576 matrix"):
        qd.DiagonalQubitUnitary(torch.ones(2 ** 20, dtype=torch.complex128), wires=range(20))


def test_unitary_check_is_stated(monkeypatch):
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1M")
    with pytest.raises(QdiffMemoryError, match=r"QubitUnitary: checking that the 256x256 "
                                                r"matrix is unitary"):
        qd.QubitUnitary(torch.eye(256, dtype=torch.complex128), wires=range(8))


def test_constant_gate_with_many_controls_builds_no_projector():
    """A constant gate has no generators, yet qd.ctrl built a 2**k x 2**k control projector:
    numpy's 'Unable to allocate 16.0 EiB' for 30 controls."""
    x = torch.tensor([[0, 1], [1, 0]], dtype=torch.complex128)

    def body(n):
        for w in range(n - 1):
            qd.X(w)
        qd.ctrl(qd.QubitUnitary(x, wires=n - 1), control=list(range(n - 1)))
        return qd.expval(qd.Z(n - 1))
    assert float(run(11, lambda: body(11))) == pytest.approx(-1.0)
    with pytest.raises(QdiffMemoryError, match="simulating 31 qubits"):
        run(31, lambda: body(31))


def test_state_prep_on_a_few_of_many_wires_refused_before_embedding():
    """StatePrep on 1 of 40 wires asked torch for the 16 TiB embedded state."""
    def body():
        qd.StatePrep(torch.tensor([0.0, 1.0]), wires=[0])
        return qd.expval(qd.Z(0))
    with pytest.raises(QdiffMemoryError, match=r"the initial state of 40 qubits \(a state "
                                                r"prepared on 1 of them\)"):
        run(40, body)


def _chain(p, method, **kw):
    @qd.qnode(qd.device("statevector", wires=1), diff_method=method, **kw)
    def f(x):
        for i in range(p):
            qd.RX(x[i], wires=0)
        return qd.expval(qd.Z(0))
    return f


@pytest.mark.parametrize("method,rows", [("parameter-shift", 2000), ("finite-diff", 2000)])
def test_shift_tables_refused_before_they_are_built(monkeypatch, method, rows):
    """The (S, P) shift table and the S shifted bindings grow as P**2: 20000 parameters
    asked torch for 6.4 GB."""
    x = torch.zeros(1000, dtype=torch.float64, requires_grad=True)
    out = _chain(1000, method)(x)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "16M")
    with pytest.raises(QdiffMemoryError, match=rf"{method}: {rows} shifted copies of 1 "
                                                r"binding\(s\) of 1000 parameters .*'adjoint'"):
        out.backward()


def test_spsa_directions_refused_before_drawing(monkeypatch):
    x = torch.zeros(10, dtype=torch.float64, requires_grad=True)
    out = _chain(10, "spsa", num_directions=10 ** 5)(x)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "16M")
    with pytest.raises(QdiffMemoryError, match=r"spsa: 200000 shifted copies"):
        out.backward()


def test_metric_tensor_rows_and_derivative_states_stated_first(monkeypatch):
    """approx=None holds P rows of P parameters and P derivative states (about 17 MB here,
    three times the 6 MB of the metric itself)."""
    @qd.qnode(qd.device("statevector", wires=2))
    def f(x):
        for i in range(600):
            qd.RX(x[i], wires=i % 2)
        return qd.expval(qd.Z(0))
    x = torch.zeros(600, dtype=torch.float64, requires_grad=True)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "8M")
    with pytest.raises(QdiffMemoryError, match=r"forward-mode derivatives: 600 rows of 600 "
                                                r"parameters"):
        qd.metric_tensor(f, approx=None)(x)


def test_block_metric_layer_circuits_stated_first(monkeypatch):
    """The block-diagonal metric runs one circuit per layer with all the gates before it:
    quadratic in the depth (20000 parameters ended in a raw MemoryError after 40 s); here
    200 layers between fixed gates hold 2.6 MB of gate references for a 0.3 MB metric."""
    @qd.qnode(qd.device("statevector", wires=2))
    def f(x):
        for i in range(200):
            qd.RX(x[i], wires=i % 2)
            for _ in range(15):
                qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Z(0))
    x = torch.zeros(200, dtype=torch.float64, requires_grad=True)
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "2M")
    with pytest.raises(QdiffMemoryError, match=r"metric_tensor\(approx='block-diag'\): 200 "
                                                r"layer circuits with \d+ gates in all"):
        qd.metric_tensor(f)(x)


@pytest.mark.parametrize("name", ["qdiff.statevector", "qdiff.mixed"])
def test_pennylane_devices_state_their_shot_samples(name):
    """PennyLane's sampler, which the devices hand the final state, asked numpy for 7.28 TiB
    at shots=10**12."""
    qml = pytest.importorskip("pennylane")
    from pennylane.exceptions import DeviceError

    @qml.set_shots(10 ** 12)
    @qml.qnode(qml.device(name, wires=2))
    def f():
        qml.Hadamard(0)
        return qml.sample(wires=[0, 1])
    with pytest.raises(DeviceError, match=rf"{name}: sampling 1000000000000 shots of 1 "
                                          r"state\(s\) on 2 wires needs about"):
        f()


def _example(name):
    import importlib
    import os
    import sys
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


@pytest.mark.parametrize("name,argv,what", [
    ("hybrid_classifier", ["--train", "10000000000", "--epochs", "1"],
     "the data set of 10000000000 samples"),
    ("bond_dissociation", ["--points", "1000000000000"], "--points 1000000000000"),
    ("vqe_h2", ["--ansatz", "hea", "--layers", "10000000000", "--steps", "1"],
     r"the weights \(10000000000, 4, 2\) of 10000000000 layers")])
def test_example_sizes_stated_before_allocating(name, argv, what):
    """Each of these was a traceback (exit 1) from torch or numpy's allocator."""
    with pytest.raises(QdiffMemoryError, match=what):
        _example(name).main(argv, log=lambda *a: None)


@pytest.mark.parametrize("make,what", [
    (lambda: multirz_gate(20), r"the matrix of MultiRZ on 20 wires"),
    (lambda: paulirot_gate("XY" * 10), r"the matrix of PauliRot 'XYXYXYXYXYXYXYXYXYXY' on 20 "
                                       r"wires")])
def test_wide_rotations_dense_only_on_demand_and_checked(make, what):
    """Wide rotations keep their Pauli word: the record is made without a dense matrix (the
    engines run it structured); the dense matrix or generator, when asked for, is stated
    first (a 2**20 x 2**20 matrix reached numpy's 'Unable to allocate' after several GiB)."""
    gate = make()
    with pytest.raises(QdiffMemoryError, match=what):
        gate.matrix(0.3)
    with pytest.raises(QdiffMemoryError, match="generator of a Pauli rotation on 20 wires"):
        np.asarray(gate.generator)
    assert gate.spectrum().tolist() == [-0.5, 0.5]


def test_multirz_diagonal_without_the_dense_product():
    g = multirz_gate(3)
    zzz = np.kron(np.kron(np.diag([1, -1]), np.diag([1, -1])), np.diag([1, -1]))
    assert np.allclose(g.generators[0], zzz / 2)
    t = torch.tensor([0.7], dtype=torch.float64)
    assert torch.allclose(g.matrix_fn(t)[0], torch.linalg.matrix_exp(
        torch.tensor(-0.35j * zzz, dtype=torch.complex128)), atol=1e-14)


def test_mixed_reverse_mode_names_backprop_when_block_superoperators_dominate():
    """An RX with 8 controls on the mixed device: its 4**9 x 4**9 superoperator (TiB) is
    refused by the reverse mode; the refusal names the method that holds none, which runs."""
    def f(a):
        for w in range(8):
            qd.H(w)
        qd.ctrl(qd.RX, control=range(8))(a, wires=8)
        return qd.expval(qd.Z(8))
    a = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(QdiffMemoryError, match="superoperators .* diff_method='backprop' holds "
                                                "none"):
        qd.qnode(qd.device("mixed", wires=9), diff_method="adjoint")(f)(a).backward()
    out = qd.qnode(qd.device("mixed", wires=9), diff_method="backprop")(f)(a)
    (g,) = torch.autograd.grad(out, a)
    assert float(out) == pytest.approx(1 - (1 - np.cos(0.3)) / 256)
    assert float(g) == pytest.approx(-np.sin(0.3) / 256)


def test_pennylane_adjoint_jacobian_states_its_repeated_states(monkeypatch):
    """The device's adjoint Jacobian repeats each final state once per output: probs of 14
    wires asked torch for 4 GiB at 16384 outputs. Stated first; the refusal names the
    vector-Jacobian product, which needs one sweep and runs within the same budget."""
    qml = pytest.importorskip("pennylane")
    from pennylane.exceptions import DeviceError
    dev = qml.device("qdiff.statevector", wires=10)
    w = torch.arange(1024, dtype=torch.float64)
    exact = None
    for kw in ({}, {"device_vjp": True}):
        @qml.qnode(dev, diff_method="adjoint", interface="torch", **kw)
        def f(x):
            qml.RX(x, wires=0)
            qml.RY(0.4, wires=1)
            return qml.probs(wires=range(10))
        x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        if exact is None:
            (exact,) = torch.autograd.grad(f(x) @ w, x)
            monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "20M")
            with pytest.raises(DeviceError, match=r"the adjoint Jacobian of 1024 outputs x 1 "
                                                  r"binding\(s\) on 10 wires .*device_vjp=True"):
                torch.autograd.grad(f(x) @ w, x)
        else:
            (g,) = torch.autograd.grad(f(x) @ w, x)
            assert torch.allclose(g, exact, atol=1e-10)


@pytest.mark.parametrize("name", ["MultiControlledX", "MultiRZ", "PauliRot"])
def test_wide_gates_are_recorded_without_their_size_in_memory(name):
    """Recording a gate on 40 wires allocates nothing of size 2**40 (no permutation tuple, no
    sign vector): the simulator's guard refuses the run at once. Narrow and wide registers of
    the same gate still run, matching PennyLane's matrix of the gate."""
    import time

    import pennylane as qml

    def make(lib, n):
        w = list(range(n))
        return {"MultiControlledX": lambda: lib.MultiControlledX(wires=w),
                "MultiRZ": lambda: lib.MultiRZ(0.3, wires=w),
                "PauliRot": lambda: lib.PauliRot(0.3, "Z" * n, wires=w)}[name]()
    t0 = time.perf_counter()
    with pytest.raises(QdiffMemoryError, match="simulating 40 qubits"):
        run(40, lambda: (make(qd, 40), qd.expval(qd.Z(0)))[1])
    assert time.perf_counter() - t0 < 10
    for n in (3, 9):  # a narrow and a wide gate (the engines' two paths)
        def body():
            for w in range(n):
                qd.RY(0.3 + 0.2 * w, wires=w)
            make(qd, n)
            return qd.state()
        start = np.array([1.0])
        for w in range(n):
            a = (0.3 + 0.2 * w) / 2
            start = np.kron(start, [np.cos(a), np.sin(a)])
        want = qml.matrix(make(qml, n), wire_order=range(n)) @ start
        assert np.allclose(run(n, body).detach().numpy(), want, atol=1e-12)
