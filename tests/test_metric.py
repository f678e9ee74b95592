"""qd.metric_tensor against PennyLane (block-diag, diag, adjoint full) and a finite-difference
Fubini-Study oracle."""
import numpy as np
import pytest
import torch

import qdiff as qd
from conftest import TORCH_DEVICES
from qdiff.metric import metric_tensor

pytestmark = pytest.mark.filterwarnings("ignore")
DEVICES = TORCH_DEVICES


def body(lib, w):
    lib.RX(0.4, wires=0)
    lib.RY(w[0], wires=0)
    lib.RZ(w[1], wires=1)
    lib.CNOT(wires=[0, 1])
    lib.Rot(w[2], w[3], w[4], wires=2)
    lib.IsingYY(w[5], wires=[1, 2])
    lib.RY(2 * w[0], wires=1)
    lib.IsingXX(w[6], wires=[0, 2])
    lib.PhaseShift(w[7], wires=1)
    lib.MultiRZ(w[8], wires=[0, 1, 2])
    lib.Hadamard(wires=2)
    lib.RX(w[9] * w[1], wires=2)


def make(device="cpu"):
    import pennylane as qml
    dev = qd.device("statevector", wires=3, device=device)

    @qd.qnode(dev)
    def f(w):
        body(qd, w)
        return qd.expval(qd.Z(0))

    @qml.qnode(qml.device("default.qubit", wires=3), interface="torch")
    def pf(w):
        body(qml, w)
        return qml.expval(qml.PauliZ(0))
    return f, pf


W = torch.tensor(np.random.default_rng(0).normal(size=10), requires_grad=True)


@pytest.mark.parametrize("approx", ["block-diag", "diag"])
def test_block_diag_matches_pennylane(approx):
    import pennylane as qml
    f, pf = make()
    ours = metric_tensor(f, approx=approx)(W)
    ref = qml.metric_tensor(pf, approx=approx)(W)
    assert ours.shape == (10, 10)
    assert torch.allclose(ours, ref.detach(), atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_full_matches_pennylane_adjoint_metric(device):
    import pennylane as qml
    f, pf = make(device)
    ours = metric_tensor(f, approx=None)(W.detach().to(device).requires_grad_())
    ref = qml.adjoint_metric_tensor(pf)(W)
    assert torch.allclose(ours.cpu(), ref.detach(), atol=1e-12)


def fs_metric_fd(circuit_fn, theta, h=1e-6):
    """Fubini-Study metric from finite-difference derivative states (independent oracle)."""
    psi = circuit_fn(theta)
    d = []
    for j in range(theta.numel()):
        e = torch.zeros_like(theta)
        e[j] = h
        d.append((circuit_fn(theta + e) - circuit_fn(theta - e)) / (2 * h))
    D = torch.stack(d)
    ov = D.conj() @ psi
    return (D.conj() @ D.T - torch.outer(ov, ov.conj())).real


def test_full_metric_vs_finite_differences_all_gate_kinds():
    """Gates PennyLane would decompose (CRX, SingleExcitation, U3, CRot) against the oracle."""
    dev = qd.device("statevector", wires=3)

    def circ(w):
        qd.RY(w[0], wires=0)
        qd.CRX(w[1], wires=[0, 1])
        qd.SingleExcitation(w[2], wires=[1, 2])
        qd.U3(w[3], w[4], w[5], wires=0)
        qd.CRot(w[6], w[7], w[8], wires=[2, 0])
        qd.IsingZZ(w[9], wires=[0, 2])

    @qd.qnode(dev)
    def f(w):
        circ(w)
        return qd.state()
    w = torch.tensor(np.random.default_rng(1).normal(size=10), requires_grad=True)
    ref = fs_metric_fd(lambda t: f(t), w.detach())
    full = metric_tensor(f, approx=None)(w)
    assert torch.allclose(full, ref, atol=1e-8)
    # diagonal of the block-diagonal metric is exact (generator variance before the gate)
    bd = metric_tensor(f, approx="block-diag")(w)
    assert torch.allclose(torch.diag(bd), torch.diag(full), atol=1e-12)



def test_block_diag_of_a_gate_with_a_generator_is_its_generator_variance():
    """FermionicSWAP has a decomposition (IsingXY and RZs sharing its angle) and a generator of
    its own: each gate's diagonal entry is the variance of its whole generator, the exact
    metric's entry, also under qd.ctrl with control value 0 and with the angle shared."""
    dev = qd.device("statevector", wires=3)

    @qd.qnode(dev)
    def f(w):
        qd.Hadamard(wires=0)
        qd.RY(0.7, wires=1)
        qd.RX(-0.4, wires=2)
        qd.FermionicSWAP(w[0], wires=[0, 1])
        qd.ctrl(qd.FermionicSWAP, control=0, control_values=0)(w[1], wires=[1, 2])
        qd.adjoint(qd.FermionicSWAP)(2 * w[2] + 0.1, wires=[2, 0])
        qd.FermionicSWAP(w[2], wires=[0, 1])
        return qd.state()
    w = torch.tensor([0.4, 1.1, -0.6], dtype=torch.float64, requires_grad=True)
    ref = fs_metric_fd(lambda t: f(t), w.detach())
    assert torch.allclose(metric_tensor(f, approx=None)(w), ref, atol=1e-8)
    # one gate per layer: diag and block-diag are the exact metric's diagonal in theta columns
    exact = metric_tensor(f, approx=None, hybrid=False)(w)
    for approx in ("block-diag", "diag"):
        g = metric_tensor(f, approx=approx, hybrid=False)(w)
        assert torch.allclose(g, torch.diag(torch.diag(exact)), atol=1e-12), approx
    assert torch.allclose(metric_tensor(f, approx="diag")(w)[0, 0], ref[0, 0], atol=1e-8)

def test_hybrid_mapping_multiple_args_and_theta_space():
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(x, y):
        qd.RX(x[0], wires=0)
        qd.RY(3 * y, wires=1)
        qd.CNOT(wires=[0, 1])
        qd.RZ(x[1] + y, wires=1)
        return qd.expval(qd.Z(1))
    x = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    y = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    gx, gy = metric_tensor(f, approx=None)(x, y)
    gt = metric_tensor(f, approx=None, hybrid=False)(x, y)  # theta columns: x0, 3y, x1+y
    J = torch.tensor([[1.0, 0, 0], [0, 0, 3.0], [0, 1.0, 1.0]], dtype=torch.float64)
    joint = J.T @ gt @ J
    assert gx.shape == (2, 2) and gy.shape == ()
    assert torch.allclose(gx, joint[:2, :2], atol=1e-12)
    assert torch.allclose(gy, joint[2, 2], atol=1e-12)


def test_batched_theta_metric_and_errors():
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev)
    def f(a):
        qd.RX(a, wires=0)
        qd.RY(a, wires=0)
        return qd.expval(qd.Z(0))
    a = torch.tensor([0.1, 0.5, 1.0], dtype=torch.float64, requires_grad=True)
    g = metric_tensor(f, approx=None, hybrid=False)(a)
    assert g.shape == (3, 2, 2)
    # RX then RY on |0>: g = [[1/4, 0], [0, cos^2(a)/4]]
    assert torch.allclose(g[:, 1, 1], torch.cos(a.detach()) ** 2 / 4, atol=1e-12)
    with pytest.raises(qd.QdiffError, match="unbatched"):
        metric_tensor(f)(a)
    with pytest.raises(qd.QdiffError, match="approx"):
        metric_tensor(f, approx="bogus")
    with pytest.raises(qd.QdiffError, match="requires grad"):
        metric_tensor(f)(torch.tensor(0.3))


def test_block_diag_on_shot_backend_within_statistics():
    dev = qd.device("statevector", wires=3, shots=20000, seed=3)
    exact_dev = qd.device("statevector", wires=3)

    def circ(w):
        for i in range(3):
            qd.RY(w[i], wires=i)
        qd.CNOT(wires=[0, 1])
        qd.CNOT(wires=[1, 2])
        for i in range(3):
            qd.RX(w[3 + i], wires=i)
        return qd.expval(qd.Z(0))
    w = torch.tensor([0.3, 0.8, -0.5, 0.2, 0.4, 1.1], requires_grad=True)
    shots = metric_tensor(qd.qnode(dev, diff_method="parameter-shift")(circ))(w)
    exact = metric_tensor(qd.qnode(exact_dev)(circ))(w)
    # each entry is a covariance of +-1/2-valued generators: standard error <= ~0.25/sqrt(shots)
    assert float((shots - exact).abs().max()) < 6 * 0.25 / np.sqrt(20000) * 2
    with pytest.raises(qd.QdiffError, match="'statevector' with shots=20000"):
        metric_tensor(qd.qnode(dev, diff_method="parameter-shift")(circ), approx=None)(w)


def test_metric_refuses_arguments_that_reach_state_preparation_or_matrices():
    """The metric is mapped to the arguments through the gate angles only: an argument that
    also feeds a state preparation or a QubitUnitary matrix would get a silently partial
    (here zero) metric."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def prep(v, w):
        qd.StatePrep(v / v.norm(), wires=[0, 1])
        qd.RY(w, wires=0)
        return qd.expval(qd.Z(0))

    @qd.qnode(dev)
    def mat(t):
        c, s = torch.cos(t / 2), torch.sin(t / 2)
        qd.QubitUnitary(torch.stack([torch.stack([c, -s]), torch.stack([s, c])]), wires=0)
        qd.RX(t, wires=1)
        return qd.expval(qd.Z(0))
    v = torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64, requires_grad=True)
    w = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    t = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    for approx in (None, "block-diag"):
        with pytest.raises(qd.QdiffError, match="state preparation"):
            metric_tensor(prep, approx=approx)(v, w)
        with pytest.raises(qd.QdiffError, match="QubitUnitary"):
            metric_tensor(mat, approx=approx)(t)
    prep(v, w).backward()
    for metric in ("full", "spsa"):
        with pytest.raises(qd.QdiffError, match="state preparation"):
            qd.QNGOptimizer([v, w], prep, metric=metric).step()
    # a constant state preparation is fine; the theta-column metric stays available
    g = metric_tensor(prep, approx=None)(v.detach(), w)
    assert torch.allclose(g, torch.tensor(0.25, dtype=torch.float64), atol=1e-12)
    assert metric_tensor(prep, approx=None, hybrid=False)(v, w).shape == (1, 1)


def test_metric_memory_checked_before_allocation(monkeypatch):
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev)
    def f(w):
        qd.RY(w.sum(), wires=0)
        qd.RX(w.sum(), wires=0)
        return qd.expval(qd.Z(0))
    w = torch.rand(4000, dtype=torch.float64, requires_grad=True)  # a 128 MB (D, D) metric
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "64M")
    for approx in (None, "diag"):
        with pytest.raises(qd.QdiffMemoryError, match="metric"):
            metric_tensor(f, approx=approx)(w)
    # the full metric's derivative states: one 2**14-amplitude state per angle (150 MB)
    big = qd.device("statevector", wires=14)

    @qd.qnode(big)
    def g(w):
        for k in range(w.shape[0]):
            qd.RY(w[k], wires=k % 14)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffMemoryError, match="derivative state per gate angle"):
        metric_tensor(g, approx=None)(torch.rand(600, dtype=torch.float64, requires_grad=True))


def test_metric_unknown_keyword_refused():
    f, _ = make()
    with pytest.raises(qd.QdiffError, match="argnum"):
        metric_tensor(f, argnum=0)


def test_metric_and_qng_of_a_qiskit_circuit_qnode():
    pytest.importorskip("qiskit")
    from qiskit import QuantumCircuit
    from qiskit.circuit import ParameterVector
    p = ParameterVector("w", 3)
    qc = QuantumCircuit(2)
    qc.ry(p[0], 0)
    qc.cx(0, 1)
    qc.rx(p[1], 1)
    qc.crz(2 * p[2], 1, 0)
    dev = qd.device("statevector", wires=2)
    qn = qd.qnode(dev)(qc)

    @qd.qnode(dev)
    def ref(w):
        qd.RY(w[0], wires=0)
        qd.CNOT(wires=[0, 1])
        qd.RX(w[1], wires=1)
        qd.CRZ(2 * w[2], wires=[1, 0])
        return qd.expval(qd.Z(0))
    w = torch.tensor([0.3, 0.5, -0.4], dtype=torch.float64, requires_grad=True)
    for approx in (None, "block-diag", "diag"):
        assert torch.allclose(metric_tensor(qn, approx=approx)(w),
                              metric_tensor(ref, approx=approx)(w), atol=1e-12)
    opt = qd.QNGOptimizer([w], qn, lr=0.1, metric="full")
    qn(w).sum().backward()
    opt.step()
    with pytest.raises(qd.QdiffError, match="qdiff qnode"):
        metric_tensor(lambda w: w.sum())(w)


def test_metric_refusals_name_trajectories_and_trainable_channels():
    w = torch.tensor([0.3, 0.5], dtype=torch.float64, requires_grad=True)

    def circ(w):
        qd.RY(w[0], wires=0)
        qd.DepolarizingChannel(0.1 * w[1], wires=0)
        qd.RX(0.3, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffError, match="DepolarizingChannel"):
        metric_tensor(qd.qnode(qd.device("mixed", wires=1))(circ))(w)
    traj = qd.qnode(qd.device("statevector", wires=1, trajectories=20, seed=0))(circ)
    with pytest.raises(qd.QdiffError, match="trajectories"):
        metric_tensor(traj, approx=None)(w)


def test_multi_parameter_gate_without_split_refused_naming_the_approximation():
    dev = qd.device("statevector", wires=3)

    @qd.qnode(dev)
    def f(w):
        qd.ctrl(qd.Rot, control=[0, 1])(w[0], w[1], w[2], wires=2)
        return qd.expval(qd.Z(2))
    w = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64, requires_grad=True)
    for approx in ("block-diag", "diag"):
        with pytest.raises(qd.QdiffError, match=f"approx='{approx}'.*C2\\(Rot\\)"):
            metric_tensor(f, approx=approx)(w)
    assert metric_tensor(f, approx=None)(w).shape == (3, 3)


@pytest.mark.parametrize("cdtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_metric_dtype_is_the_qnode_output_dtype_for_every_approx(dtype, cdtype):
    dev = qd.device("statevector", wires=2, dtype=cdtype)

    @qd.qnode(dev)
    def f(x):
        qd.RX(x[0], wires=0)
        qd.RY(x[1], wires=1)
        qd.CNOT(wires=[0, 1])
        qd.RZ(x[0], wires=1)
        qd.RY(x[1], wires=0)
        return qd.expval(qd.Z(0) @ qd.Z(1))
    x = torch.tensor([1.3, 0.05], dtype=dtype, requires_grad=True)
    assert f(x).dtype == dtype
    exact = {a: metric_tensor(f, approx=a)(x.detach().double().requires_grad_())
             for a in (None, "block-diag", "diag")}
    tol = 1e-6 if cdtype == torch.complex64 else 1e-12
    for approx in (None, "block-diag", "diag"):
        for hybrid in (True, False):
            g = metric_tensor(f, approx=approx, hybrid=hybrid)(x)
            assert g.dtype == dtype, (approx, hybrid)
        # computed in the device's precision, then rounded once to the argument's dtype
        g = metric_tensor(f, approx=approx)(x).double()
        err = (exact[approx].to(dtype).double() - exact[approx]).abs().max().item()
        assert (g - exact[approx]).abs().max().item() <= err + tol, approx
    a = torch.tensor(0.3, dtype=dtype, requires_grad=True)
    b = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)

    @qd.qnode(dev)
    def f2(a, b):
        qd.RX(a, wires=0)
        qd.RY(b, wires=1)
        qd.CNOT(wires=[0, 1])
        qd.RZ(b, wires=1)
        return qd.expval(qd.Z(0) @ qd.Z(1))
    for approx in (None, "block-diag", "diag"):  # several arguments: promoted, as the output
        assert [g.dtype for g in metric_tensor(f2, approx=approx)(a, b)] == [f2(a, b).dtype] * 2
