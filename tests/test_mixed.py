"""The mixed-state engine against PennyLane's default.mixed (values, density matrices and
backprop gradients), finite differences, closed forms, and bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff.circuits import channels as C

qml = pytest.importorskip("pennylane")

GATES_1Q = [("Hadamard", 0), ("S", 0), ("T", 0), ("SX", 0), ("PauliX", 0), ("PauliY", 0),
            ("RX", 1), ("RY", 1), ("RZ", 1), ("PhaseShift", 1), ("Rot", 3), ("U3", 3)]
GATES_2Q = [("CNOT", 0), ("CZ", 0), ("CY", 0), ("SWAP", 0), ("ISWAP", 0), ("CRX", 1),
            ("CRY", 1), ("CRZ", 1), ("IsingXX", 1), ("IsingYY", 1), ("IsingZZ", 1),
            ("ControlledPhaseShift", 1), ("CRot", 3), ("SingleExcitation", 1)]
GATES_3Q = [("Toffoli", 0), ("CSWAP", 0)]
CHANNELS_1Q = [("BitFlip", lambda r: [r.uniform(0, 1)]),
               ("PhaseFlip", lambda r: [r.uniform(0, 1)]),
               ("DepolarizingChannel", lambda r: [r.uniform(0, 1)]),
               ("AmplitudeDamping", lambda r: [r.uniform(0, 1)]),
               ("GeneralizedAmplitudeDamping", lambda r: [r.uniform(0, 1), r.uniform(0, 1)]),
               ("PhaseDamping", lambda r: [r.uniform(0, 1)]),
               ("ResetError", lambda r: [r.uniform(0, 0.5), r.uniform(0, 0.5)]),
               ("ThermalRelaxationError", lambda r: _thermal(r))]


def _thermal(r):
    t1 = r.uniform(50, 150)
    return [r.uniform(0, 1), t1, r.uniform(10, 2 * t1), r.uniform(1, 30)]


def random_kraus(r, k, wires=1):
    """A random trace-preserving Kraus set (k operators) from an isometry."""
    d = 2 ** wires
    a = r.normal(size=(k * d, d)) + 1j * r.normal(size=(k * d, d))
    q, _ = np.linalg.qr(a)
    return [q[i * d:(i + 1) * d] for i in range(k)]


def random_ops(r, n, depth, trainable_channels=True):
    """``[(kind, name, wires, params)]``; kind: gate, channel, pauli (word), kraus (matrices)."""
    ops = []
    for _ in range(depth):
        u = r.uniform()
        if u < 0.4 or n == 1:
            name, p = GATES_1Q[r.integers(len(GATES_1Q))]
            ops.append(("gate", name, [int(r.integers(n))], list(r.uniform(-np.pi, np.pi, p))))
        elif u < 0.6 or n < 3:
            name, p = GATES_2Q[r.integers(len(GATES_2Q))]
            ops.append(("gate", name, [int(w) for w in r.choice(n, 2, replace=False)],
                        list(r.uniform(-np.pi, np.pi, p))))
        elif u < 0.63:
            name, _ = GATES_3Q[r.integers(len(GATES_3Q))]
            ops.append(("gate", name, [int(w) for w in r.choice(n, 3, replace=False)], []))
        elif u < 0.9:
            name, gen = CHANNELS_1Q[r.integers(len(CHANNELS_1Q))]
            ops.append(("channel", name, [int(r.integers(n))], gen(r)))
        elif u < 0.95:
            k = int(r.integers(1, min(n, 2) + 1))
            word = "".join(r.choice(list("IXYZ"), k))
            ops.append(("pauli", word, [int(w) for w in r.choice(n, k, replace=False)],
                        [r.uniform(0, 1)]))
        else:
            ops.append(("kraus", random_kraus(r, int(r.integers(1, 4))), [int(r.integers(n))],
                        []))
    return ops


def random_observable(r, n):
    terms = []
    for _ in range(int(r.integers(1, 4))):
        word = {int(w): str(r.choice(list("XYZ"))) for w in
                r.choice(n, int(r.integers(1, n + 1)), replace=False)}
        terms.append((float(r.normal()), word))
    return terms


def qd_obs(terms):
    total = None
    for c, word in terms:
        t = None
        for w, l in word.items():
            f = getattr(qd, l)(w)
            t = f if t is None else t @ f
        total = c * t if total is None else total + c * t
    return total


def pl_obs(terms):
    ops = []
    for c, word in terms:
        ops.append(qml.prod(*[getattr(qml, "Pauli" + l)(w) for w, l in word.items()]))
    return qml.Hamiltonian([c for c, _ in terms], ops)


def run_ops(lib, ops, params):
    """Apply ``ops`` with ``lib`` (qd or qml); ``params`` replaces each op's parameters."""
    for (kind, name, wires, _), ps in zip(ops, params):
        if kind == "gate":
            getattr(lib, name)(*ps, wires=wires)
        elif kind == "channel":
            getattr(lib, name)(*ps, wires=wires)
        elif kind == "pauli":
            lib.PauliError(name, ps[0], wires=wires)
        else:
            lib.QubitChannel(name, wires=wires)


def measurements(lib, r_meas, n):
    kinds, obs, wires = r_meas
    out = []
    for k, o, w in zip(kinds, obs, wires):
        if k == "expval":
            out.append(lib.expval(qd_obs(o) if lib is qd else pl_obs(o)))
        elif k == "var":
            out.append(lib.var(qd_obs(o) if lib is qd else pl_obs(o)))
        elif k == "probs":
            out.append(lib.probs(wires=w))
        elif k == "density_matrix":
            out.append(lib.density_matrix(wires=w))
        else:
            out.append(lib.purity(wires=w))
    return out


def random_measurements(r, n):
    kinds = list(r.choice(["expval", "var", "probs", "density_matrix", "purity"],
                          int(r.integers(1, 4))))
    obs = [random_observable(r, n) for _ in kinds]
    wires = [[int(w) for w in r.choice(n, int(r.integers(1, n + 1)), replace=False)]
             for _ in kinds]
    return kinds, obs, wires


def compare_one(seed, batch=2):
    r = np.random.default_rng(seed)
    n = int(r.integers(1, 5))
    ops = random_ops(r, n, int(r.integers(3, 16)))
    meas = random_measurements(r, n)
    # the first gate angle (if any) is batched: B bindings
    bidx = next((i for i, o in enumerate(ops) if o[0] == "gate" and o[3]), None)
    angles = r.uniform(-np.pi, np.pi, batch)

    def params_for(b, as_tensor):
        ps = []
        for i, o in enumerate(ops):
            p = list(o[3])
            if i == bidx:
                p[0] = torch.tensor(angles) if as_tensor else angles[b]
            ps.append(p)
        return ps

    dev = qd.device("mixed", wires=n)
    got = qd.qnode(dev)(lambda: (run_ops(qd, ops, params_for(None, True)),
                                 measurements(qd, meas, n))[1])()
    if isinstance(got, torch.Tensor):  # all scalar: stacked on the last dim
        got = list(got.unbind(-1))
    pl_dev = qml.device("default.mixed", wires=n)

    @qml.qnode(pl_dev)
    def ref(b):
        run_ops(qml, ops, params_for(b, False))
        return measurements(qml, meas, n)

    for b in range(batch if bidx is not None else 1):
        want = ref(b)
        for g, w in zip(got, want):
            g = g[b] if bidx is not None else g
            np.testing.assert_allclose(np.asarray(g.detach()), np.asarray(w), atol=1e-10,
                                       rtol=0, err_msg=f"seed {seed}")


@pytest.mark.parametrize("seed", range(30))
def test_random_noisy_circuits_equal_default_mixed(seed):
    compare_one(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(30, 150))
def test_random_noisy_circuits_equal_default_mixed_bulk(seed):
    compare_one(seed)


def test_every_channel_and_measurement_is_exercised():
    seen_ch, seen_m = set(), set()
    for seed in range(30):
        r = np.random.default_rng(seed)
        n = int(r.integers(1, 5))
        ops = random_ops(r, n, int(r.integers(3, 16)))
        seen_ch |= {o[1] if o[0] == "channel" else o[0] for o in ops if o[0] != "gate"}
        seen_m |= set(random_measurements(r, n)[0])
    assert {c[0] for c in CHANNELS_1Q} | {"pauli", "kraus"} <= seen_ch
    assert seen_m == {"expval", "var", "probs", "density_matrix", "purity"}


# ------------------------------------------------------------------------------------------
# gradients


def _grad_circuit(lib, x, p, g):
    lib.RX(x[0], wires=0)
    lib.RY(x[1], wires=1)
    lib.CNOT(wires=[0, 1])
    lib.DepolarizingChannel(p[0], wires=0)
    lib.AmplitudeDamping(p[1], wires=1)
    lib.CRZ(x[2], wires=[1, 0])
    lib.GeneralizedAmplitudeDamping(p[2], p[3], wires=0)
    lib.ThermalRelaxationError(p[4], g[0], g[1], g[2], wires=1)
    lib.PhaseDamping(p[5], wires=0)
    lib.Rot(x[3], x[4], x[5], wires=1)
    lib.BitFlip(p[6], wires=1)
    lib.ResetError(p[7], p[8], wires=0)
    lib.PauliError("XZ", p[9], wires=[1, 0])
    lib.PhaseFlip(p[10], wires=1)


def _values():
    r = np.random.default_rng(7)
    x = r.uniform(-2, 2, 6)
    p = r.uniform(0.05, 0.4, 11)
    g = np.array([90.0, 60.0, 12.0])  # t1, t2, tq
    return x, p, g


def _qd_fn(dev):
    H = 0.7 * qd.Z(0) @ qd.Z(1) + 0.3 * qd.X(0) - 0.4 * qd.Y(1)

    @qd.qnode(dev, diff_method="backprop")
    def f(x, p, g):
        _grad_circuit(qd, x, p, g)
        return qd.expval(H), qd.var(qd.X(1)), qd.purity([0, 1])
    return f


def test_gradients_equal_default_mixed_backprop_and_finite_differences():
    x, p, g = _values()
    f = _qd_fn(qd.device("mixed", wires=2))
    tx = torch.tensor(x, requires_grad=True)
    tp = torch.tensor(p, requires_grad=True)
    tg = torch.tensor(g, requires_grad=True)
    jac = torch.autograd.functional.jacobian(lambda a, b, c: torch.stack(f(a, b, c)),
                                             (tx, tp, tg))

    H = 0.7 * qml.PauliZ(0) @ qml.PauliZ(1) + 0.3 * qml.PauliX(0) - 0.4 * qml.PauliY(1)
    pnp = qml.numpy

    # PennyLane's backprop through autograd (its torch path loses ~1e-9 in these channels)
    @qml.qnode(qml.device("default.mixed", wires=2), interface="autograd", diff_method="backprop")
    def ref(a, b, c):
        _grad_circuit(qml, a, b, c)
        return pnp.stack([qml.expval(H), qml.var(qml.PauliX(1)), qml.purity(wires=[0, 1])])

    def stacked(a, b, c):
        return pnp.stack(ref(a, b, c))
    pj = qml.jacobian(stacked, argnums=[0, 1, 2])(pnp.array(x, requires_grad=True),
                                                 pnp.array(p, requires_grad=True),
                                                 pnp.array(g, requires_grad=True))
    for a, b in zip(jac, pj):
        np.testing.assert_allclose(a.numpy(), np.asarray(b), atol=1e-8, rtol=0)
    # central finite differences (all three inputs at once, one direction per column)
    h = 1e-5
    for k, base in enumerate((x, p, g)):
        for j in range(len(base)):
            args_p = [x.copy(), p.copy(), g.copy()]
            args_m = [x.copy(), p.copy(), g.copy()]
            args_p[k][j] += h
            args_m[k][j] -= h
            fp = f(*[torch.tensor(a) for a in args_p])
            fm = f(*[torch.tensor(a) for a in args_m])
            fd = (torch.stack(fp) - torch.stack(fm)) / (2 * h)
            np.testing.assert_allclose(jac[k][:, j].numpy(), fd.numpy(), atol=1e-8, rtol=0)


def test_channel_gradient_at_zero_probability_is_finite():
    dev = qd.device("mixed", wires=1)

    @qd.qnode(dev)
    def f(p):
        qd.Hadamard(0)
        qd.DepolarizingChannel(p, wires=0)
        qd.BitFlip(p, wires=0)
        return qd.expval(qd.X(0))
    p = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    f(p).backward()
    # <X> = 1 - 4p/3 (depolarizing; the bit flip leaves |+> alone)
    assert abs(float(p.grad) + 4 / 3) < 1e-12


def _damped_one():
    """<Z> after X and AmplitudeDamping(g) on the mixed device: 2g - 1."""
    @qd.qnode(qd.device("mixed", wires=1))
    def f(g):
        qd.PauliX(0)
        qd.AmplitudeDamping(g, wires=0)
        return qd.expval(qd.Z(0))
    return f


def test_batched_channel_parameters_and_closed_forms():
    f = _damped_one()
    g = torch.linspace(0, 1, 5, dtype=torch.float64)
    torch.testing.assert_close(f(g), 2 * g - 1)


def test_channel_parameters_as_lists_arrays_and_under_vmap_are_batches():
    """As for gate angles, a list or a numpy array is a batch of values, and torch.func.vmap
    maps over channel parameters: <Z> after X and AmplitudeDamping(g) is 2g - 1."""
    f = _damped_one()
    want = torch.tensor([-0.8, 0.0, 0.4], dtype=torch.float64)
    for g in ([0.1, 0.5, 0.7], np.array([0.1, 0.5, 0.7]), (0.1, 0.5, 0.7)):
        torch.testing.assert_close(f(g), want)
    assert abs(float(f(np.float32(0.5)))) < 1e-7
    g = torch.tensor([0.1, 0.5, 0.7], dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(f)(g), want)
    with pytest.raises(qd.QdiffError, match="AmplitudeDamping.*gamma=1.5"):
        torch.func.grad(f)(torch.tensor(1.5, dtype=torch.float64))


def test_static_qnodes_take_channel_parameters_as_numbers():
    dev = qd.device("mixed", wires=1)

    def body(x, g):
        qd.RX(x, wires=0)
        qd.AmplitudeDamping(g, wires=0)
        return qd.expval(qd.Z(0))
    f = qd.qnode(dev, static=True)(body)
    x = torch.tensor(0.4, dtype=torch.float64)
    # <Z> = 1 - (1 - g)(1 - cos x)
    assert abs(float(f(x, 0.3)) - (1 - 0.7 * (1 - math.cos(0.4)))) < 1e-12
    with pytest.raises(qd.QdiffError, match="AmplitudeDamping.*gamma.*static"):
        f(x, torch.tensor(0.3, dtype=torch.float64))


def test_channel_parameters_by_pennylane_keywords_equal_default_mixed():
    pytest.importorskip("pennylane")
    import pennylane as qml

    def body(lib):
        lib.RX(0.7, wires=0)
        lib.RY(0.4, wires=1)
        lib.CNOT(wires=[0, 1])
        lib.BitFlip(p=0.1, wires=0)
        lib.DepolarizingChannel(p=0.2, wires=1)
        lib.AmplitudeDamping(gamma=0.3, wires=0)
        lib.GeneralizedAmplitudeDamping(p=0.2, gamma=0.3, wires=1)
        lib.PhaseDamping(gamma=0.4, wires=0)
        lib.ResetError(p0=0.1, p1=0.2, wires=1)
        lib.ThermalRelaxationError(0.1, 10.0, t2=12.0, tg=1.0, wires=0)
        return lib.density_matrix(wires=[0, 1])
    got = qd.qnode(qd.device("mixed", wires=2))(lambda: body(qd))()
    want = qml.qnode(qml.device("default.mixed", wires=2))(lambda: body(qml))()
    np.testing.assert_allclose(got.numpy(), np.asarray(want), atol=1e-12)
    with pytest.raises(qd.QdiffError, match="BitFlip.*p given twice"):
        qd.BitFlip(0.1, p=0.2, wires=0)
    with pytest.raises(qd.QdiffError, match=r"ResetError.*missing.*p_1"):
        qd.ResetError(p0=0.1, wires=0)


def test_pennylane_channels_in_a_qdiff_qnode_are_qdiffs_channels():
    pytest.importorskip("pennylane")
    import pennylane as qml
    kraus = [np.sqrt(0.8) * np.eye(2), np.sqrt(0.2) * np.array([[0.0, 1.0], [1.0, 0.0]])]

    def body(x, p):
        qml.RX(x, wires=0)
        qml.CNOT(wires=[0, 1])
        qml.AmplitudeDamping(p, wires=1)
        qml.ThermalRelaxationError(0.1, 50.0, 40.0, 5.0, wires=0)
        qml.PauliError("YZ", p, wires=[1, 0])
        qml.QubitChannel(kraus, wires=1)
        return qml.expval(qml.PauliZ(1) + qml.PauliX(0))

    want_f = qml.QNode(body, qml.device("default.mixed", wires=2), diff_method="backprop")
    for method in ("best", "backprop"):
        x = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        p = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
        got = qd.qnode(qd.device("mixed", wires=2), diff_method=method)(body)(x, p)
        g = torch.autograd.grad(got, (x, p))
        x2 = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        p2 = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
        want = want_f(x2, p2)
        w = torch.autograd.grad(want, (x2, p2))
        assert abs(float(got) - float(want)) < 1e-8
        for a, b in zip(g, w):
            assert abs(float(a) - float(b)) < 1e-7
    with pytest.raises(qd.QdiffError, match="AmplitudeDamping.*trajectories"):
        qd.qnode(qd.device("statevector", wires=2))(body)(0.3, 0.2)


def test_thermal_relaxation_without_t1_or_t2_decay():
    """t1 = inf or t2 = inf (no decay of that kind), as PennyLane and Qiskit accept: after
    RY(x), <X> = sin(x) exp(-tq/t2) and <Z> = cos(x) when t1 = inf; no change at all when both
    are inf; a noise model takes the same values."""
    inf = math.inf
    dev = qd.device("mixed", wires=1)

    @qd.qnode(dev)
    def f(t1, t2):
        qd.RY(0.9, wires=0)
        qd.ThermalRelaxationError(0.1, t1, t2, 2.0, wires=0)
        return qd.expval(qd.X(0)), qd.expval(qd.Z(0))
    x, z = f(inf, 8.0)
    assert abs(float(x) - math.sin(0.9) * math.exp(-2 / 8)) < 1e-12
    assert abs(float(z) - math.cos(0.9)) < 1e-12
    x, z = f(inf, inf)
    assert abs(float(x) - math.sin(0.9)) < 1e-12 and abs(float(z) - math.cos(0.9)) < 1e-12
    m = qd.noise.NoiseModel().add("ry", qd.ThermalRelaxationError, 0.1, inf, 8.0, 2.0)
    g = qd.qnode(qd.device("mixed", wires=1, noise=m))(lambda: (qd.RY(0.9, wires=0),
                                                               qd.expval(qd.X(0)))[-1])
    assert abs(float(g()) - math.sin(0.9) * math.exp(-2 / 8)) < 1e-12
    with pytest.raises(qd.QdiffError, match="ThermalRelaxationError.*t1"):
        f(-inf, 8.0)
    with pytest.raises(qd.QdiffError, match="ThermalRelaxationError.*2\\*t1"):
        f(5.0, inf)


def test_thermal_relaxation_takes_infinite_t1_and_t2_as_tensors():
    """t1 = inf given as a (trainable) tensor, alone or in a batch, equals the float: an
    infinite T1 or T2 is a valid parameter, not a NaN angle; its gradient is 0."""
    inf = math.inf
    dev = qd.device("mixed", wires=1)

    @qd.qnode(dev)
    def f(t1, t2):
        qd.RY(0.9, wires=0)
        qd.ThermalRelaxationError(0.1, t1, t2, 2.0, wires=0)
        return qd.expval(qd.X(0))
    t1 = torch.tensor(inf, dtype=torch.float64, requires_grad=True)
    t2 = torch.tensor(8.0, dtype=torch.float64, requires_grad=True)
    x = f(t1, t2)
    x.backward()
    assert abs(x.item() - math.sin(0.9) * math.exp(-2 / 8)) < 1e-12
    assert float(t1.grad) == 0.0
    assert abs(float(t2.grad) - math.sin(0.9) * math.exp(-2 / 8) * 2 / 64) < 1e-12
    both = f(torch.tensor([inf, 20.0], dtype=torch.float64), 8.0)
    torch.testing.assert_close(both[0], f(inf, 8.0))
    torch.testing.assert_close(both[1], f(20.0, 8.0))
    with pytest.raises(qd.QdiffError, match="ThermalRelaxationError.*t2"):
        f(torch.tensor(10.0, dtype=torch.float64), torch.tensor(-inf, dtype=torch.float64))


@pytest.mark.parametrize("kind, wires", [("pauli", [3, 1, 0]), ("pauli", [0, 2, 3, 1]),
                                         ("kraus", [2, 0, 3])])
def test_channels_on_three_or_more_wires_equal_default_mixed(kind, wires):
    """PauliError of a 3- or 4-letter word and a 3-qubit QubitChannel (unordered wires):
    density matrix equal to default.mixed; gradients of the Pauli error's probability and of
    the angles equal central finite differences on every diff method."""
    r = np.random.default_rng(7)
    n = 4
    word = "XYZX"[:len(wires)]
    kraus = random_kraus(r, 2, 3)

    def body(lib, x, p):
        for w in range(n):
            lib.RY(0.3 + 0.4 * w, wires=w)
            lib.RZ(0.7 * w + 0.1, wires=w)
        lib.CNOT(wires=[0, 1])
        lib.RX(x, wires=2)
        if kind == "pauli":
            lib.PauliError(word, p, wires=wires)
        else:
            lib.QubitChannel(kraus, wires=wires)
        lib.CNOT(wires=[1, 2])
        lib.RY(0.7 * x, wires=3)

    want = qml.qnode(qml.device("default.mixed", wires=n))(
        lambda x, p: (body(qml, x, p), qml.density_matrix(wires=range(n)))[1])
    got = qd.qnode(qd.device("mixed", wires=n))(
        lambda x, p: (body(qd, x, p), qd.density_matrix(wires=range(n)))[1])
    np.testing.assert_allclose(got(0.4, 0.2).numpy(), np.asarray(want(0.4, 0.2)), atol=1e-12)
    for method in ("best", "adjoint", "backprop"):
        f = qd.qnode(qd.device("mixed", wires=n), diff_method=method)(
            lambda x, p: (body(qd, x, p), qd.expval(qd.Z(0) @ qd.X(3) + 0.3 * qd.Y(2)))[1])
        x = torch.tensor([0.4, 1.1], dtype=torch.float64, requires_grad=True)
        p = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
        f(x, p).sum().backward()
        h = 1e-6
        with torch.no_grad():
            fx = (f(x + h, p) - f(x - h, p)) / (2 * h)
            fp = ((f(x, p + h) - f(x, p - h)) / (2 * h)).sum()
        torch.testing.assert_close(x.grad, fx, atol=1e-8, rtol=0)
        if kind == "pauli":
            assert abs(float(p.grad) - float(fp)) < 1e-8


def test_superoperators_of_wide_channels_are_checked_against_memory(monkeypatch):
    """A channel on k wires has a 16**k superoperator: refused before it is built when it
    does not fit (a PauliError on 8 wires: 68 GiB and more), naming the channel; the trajectory
    method draws one Kraus operator per trajectory, also checked first."""
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "64M")
    k = 8

    def body():
        qd.PauliError("X" * k, 0.1, wires=list(range(k)))
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffMemoryError, match=r"PauliError\[XXXXXXXX\].*8 wires"):
        qd.qnode(qd.device("mixed", wires=k))(body)()
    kraus = [math.sqrt(0.5) * np.eye(2 ** k), math.sqrt(0.5) * np.diag([1, -1] * 2 ** (k - 1))]
    with pytest.raises(qd.QdiffMemoryError, match="QubitChannel.*8 wires"):
        qd.qnode(qd.device("mixed", wires=k))(
            lambda: (qd.QubitChannel(kraus, wires=list(range(k))), qd.expval(qd.Z(0)))[1])()
    with pytest.raises(qd.QdiffMemoryError, match="Kraus operators of 2000 trajectories"):
        qd.qnode(qd.device("statevector", wires=k, trajectories=2000, seed=1))(body)()
    got = qd.qnode(qd.device("statevector", wires=k, trajectories=20, seed=1))(body)()
    assert abs(float(got) - 0.8) < 0.7  # 0.8 (X...X with probability 0.1) +- 5 std. errors


def test_noiseless_circuits_agree_with_the_statevector_engine():
    r = np.random.default_rng(3)
    n = 3
    ops = [o for o in random_ops(r, n, 30) if o[0] == "gate"]
    terms = random_observable(r, n)

    def body(lib):
        run_ops(lib, ops, [o[3] for o in ops])
        return lib.expval(qd_obs(terms)), lib.probs(wires=[0, 2])
    a = qd.qnode(qd.device("mixed", wires=n))(lambda: body(qd))()
    b = qd.qnode(qd.device("statevector", wires=n))(lambda: body(qd))()
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, atol=1e-12, rtol=0)


def test_shots_sample_counts_and_probs():
    dev = qd.device("mixed", wires=2, shots=4000, seed=1)

    @qd.qnode(dev)
    def f():
        qd.Hadamard(0)
        qd.CNOT(wires=[0, 1])
        qd.BitFlip(0.2, wires=1)
        return qd.probs(wires=[0, 1]), qd.sample(wires=[0, 1]), qd.expval(qd.Z(0) @ qd.Z(1))
    p, s, e = f()
    exact = torch.tensor([0.4, 0.1, 0.1, 0.4], dtype=p.dtype)
    assert (p - exact).abs().max() < 0.04
    assert s.shape == (4000, 2)
    assert abs(float(e) - 0.6) < 0.06

    @qd.qnode(dev)
    def g():
        qd.PauliX(0)
        return qd.counts(wires=[0])
    assert g() == {"1": 4000}


def test_sampled_observables_go_through_the_readout_errors_of_their_wires():
    """sample(op) reads the op's wires out in its eigenbasis, through each wire's confusion
    matrix, as sample(wires=...) does: a definite +1 read with P(flip) = p01 (prepared 0),
    so the mean is 1 - 2*p01; a product of two such wires has mean (1 - 2*p01)(1 - 2*p01')."""
    m = qd.noise.NoiseModel().add_readout(0, 0.2, 0.1).add_readout(1, 0.05, 0.3)
    dev = qd.device("mixed", wires=2, noise=m, shots=40000, seed=1)

    @qd.qnode(dev)
    def f():
        qd.Hadamard(1)
        return (qd.sample(qd.Z(0)), qd.sample(qd.X(1)), qd.sample(qd.Z(0) @ qd.X(1)),
                qd.sample(wires=[0]))
    z0, x1, zx, bits = f()
    tol = 5 / math.sqrt(40000)
    assert abs(float(z0.double().mean()) - 0.6) < tol
    assert abs(float(x1.double().mean()) - 0.9) < tol
    assert abs(float(zx.double().mean()) - 0.54) < tol
    assert abs(float(1 - 2 * bits.double().mean()) - 0.6) < tol


def test_density_matrix_wire_order_and_purity_of_bell_state():
    dev = qd.device("mixed", wires=3)

    @qd.qnode(dev)
    def f():
        qd.PauliX(2)
        qd.Hadamard(0)
        qd.CNOT(wires=[0, 1])
        return qd.density_matrix([2, 0]), qd.purity([0]), qd.purity([0, 1])
    rho, p1, p2 = f()
    want = torch.zeros(4, 4, dtype=torch.complex128)
    want[2, 2] = want[3, 3] = 0.5  # wire 2 in |1>, wire 0 maximally mixed
    torch.testing.assert_close(rho, want)
    assert abs(float(p1) - 0.5) < 1e-12 and abs(float(p2) - 1) < 1e-12


# ------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("call, words", [
    (lambda: qd.DepolarizingChannel(1.5, wires=0), ["DepolarizingChannel", "p=1.5"]),
    (lambda: qd.AmplitudeDamping(-0.1, wires=0), ["AmplitudeDamping", "gamma"]),
    (lambda: qd.ResetError(0.6, 0.6, wires=0), ["ResetError", "p_0 + p_1"]),
    (lambda: qd.GeneralizedAmplitudeDamping(0.2, 2.0, wires=0), ["GeneralizedAmplitude", "p="]),
    (lambda: qd.ThermalRelaxationError(0.1, 10.0, 30.0, 1.0, wires=0), ["t2", "2*t1"]),
    (lambda: qd.ThermalRelaxationError(0.1, -1.0, 1.0, 1.0, wires=0), ["t1", "positive"]),
    (lambda: qd.QubitChannel([np.eye(2), np.eye(2)], wires=0), ["QubitChannel",
                                                                 "trace preserving"]),
    (lambda: qd.QubitChannel([np.eye(3)], wires=0), ["QubitChannel", "2**k"]),
    (lambda: qd.QubitChannel(torch.eye(2, dtype=torch.complex128)[None].requires_grad_(),
                             wires=0), ["QubitChannel", "require grad"]),
    (lambda: qd.QubitChannel([torch.eye(2, dtype=torch.complex128).requires_grad_()],
                             wires=0), ["QubitChannel", "require grad"]),
    (lambda: qd.PauliError("XQ", 0.1, wires=[0, 1]), ["PauliError", "XQ"]),
    (lambda: qd.BitFlip(torch.tensor([0.1, 1.2]), wires=0), ["BitFlip", "1.2"]),
    (lambda: qd.BitFlip("0.1", wires=0), ["BitFlip", "p"]),
    (lambda: qd.BitFlip(0.1 + 0.2j, wires=0), ["BitFlip", "parameter p", "real"]),
    (lambda: qd.BitFlip(np.complex128(0.1), wires=0), ["BitFlip", "parameter p", "real"]),
    (lambda: qd.BitFlip(torch.tensor(0.1 + 0j), wires=0), ["BitFlip", "parameter p", "real"]),
    (lambda: qd.BitFlip([[0.1], "a"], wires=0), ["BitFlip", "parameter p", "real"]),
    (lambda: qd.BitFlip([0.1, 1.2], wires=0), ["BitFlip", "1.2"]),
    (lambda: qd.BitFlip(0.1, wires=0, foo=1), ["BitFlip", "foo"]),
    (lambda: qd.DepolarizingChannel(0.1, wires=[0, 1]), ["DepolarizingChannel", "1 wire"]),
])
def test_bad_channel_input_names_the_channel_and_parameter(call, words):
    with pytest.raises(qd.QdiffError) as e:
        call()
    for w in words:
        assert w in str(e.value)


def test_channels_on_a_statevector_device_are_refused():
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev)
    def f():
        qd.BitFlip(0.1, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffError, match="BitFlip.*trajectories"):
        f()


def test_too_many_qubits_for_density_matrices_is_refused():
    with pytest.raises(qd.QdiffError, match=r"density matrices.*16\*4\*\*n"):
        qd.device("mixed", wires=30)


def test_state_on_mixed_device_says_to_use_density_matrix():
    @qd.qnode(qd.device("mixed", wires=1))
    def f():
        return qd.state()
    with pytest.raises(qd.QdiffError, match="density_matrix"):
        f()


def test_best_with_shots_differentiates_channel_parameters_by_finite_differences():
    from qdiff.rules import FINITE_DIFF, best
    dev = qd.device("mixed", wires=1, shots=200000, seed=3)

    @qd.qnode(dev)
    def f(x, p):
        qd.RX(x, wires=0)
        qd.DepolarizingChannel(p, wires=0)
        return qd.expval(qd.Z(0))
    x = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    p = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    assert best(dev, f.construct(x, p)[0].circuit, f.construct(x, p)[0]) is FINITE_DIFF
    f(x, p).backward()
    # <Z> = cos(x) (1 - 4p/3)
    assert abs(float(x.grad) + math.sin(0.5) * (1 - 0.8 / 3)) < 0.03
    assert abs(float(p.grad) + 4 / 3 * math.cos(0.5)) < 0.03


def test_shots_from_a_channel_outside_its_range_are_refused_naming_it():
    """Finite differences with shots ('best', step 0.1) evaluate AmplitudeDamping at gamma
    +- 0.1. After RX(x) the shifted map at gamma = -0.05 still gives a distribution
    (P(1) = (1 - gamma) sin(x/2)**2), whose central difference is the exact derivative in
    expectation: dP(1)/dgamma = -sin(x/2)**2. At gamma = 0.97 the shift reaches 1.07 and
    P(1) < 0: refused (never clipped), naming the channel and the parameter."""
    dev = qd.device("mixed", wires=1, shots=200000, seed=5)

    @qd.qnode(dev)
    def f(g):
        qd.RX(0.5, wires=0)
        qd.AmplitudeDamping(g, wires=0)
        return qd.probs(wires=[0])
    s2 = math.sin(0.25) ** 2
    g = torch.tensor(0.05, dtype=torch.float64, requires_grad=True)
    f(g)[1].backward()
    assert abs(float(g.grad) + s2) < 5 * math.sqrt(2 * s2 / 200000) / 0.2
    g = torch.tensor(0.97, dtype=torch.float64, requires_grad=True)
    with pytest.raises(qd.QdiffError, match=r"not a distribution.*AmplitudeDamping.*gamma=1.07"):
        f(g)[1].backward()


def test_trainable_gate_matrix_is_differentiated_by_backprop():
    """A QubitUnitary (also controlled) of a matrix that requires grad is no constant of the
    mixed engine: backprop differentiates it (the closed form, and the statevector engine's
    gradient); parameter-shift refuses it by name (never a silently missing gradient)."""
    def ry(a):
        c, s = torch.cos(a / 2), torch.sin(a / 2)
        return torch.stack([torch.stack([c, -s]), torch.stack([s, c])]).to(torch.complex128)

    def circuit(a):
        qd.QubitUnitary(ry(a), wires=0)
        qd.ctrl(qd.QubitUnitary(ry(2 * a), wires=1), control=0)
        return qd.expval(qd.Z(0)), qd.expval(qd.Z(1))

    def grads(name, method, noisy):
        @qd.qnode(qd.device(name, wires=2), diff_method=method)
        def f(a):
            if noisy:
                qd.DepolarizingChannel(0.1, wires=0)
            return circuit(a)
        a = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        z0, z1 = f(a)
        return torch.stack([z0, z1]).detach(), torch.autograd.grad(z0 + 2 * z1, a)[0]
    v, g = grads("mixed", "backprop", True)
    assert abs(float(v[0]) - math.cos(0.7) * (1 - 4 * 0.1 / 3)) < 1e-12
    vs, gs = grads("statevector", "backprop", False)
    vm, gm = grads("mixed", "best", False)
    torch.testing.assert_close(vm, vs, atol=1e-12, rtol=0)
    torch.testing.assert_close(gm, gs, atol=1e-12, rtol=0)
    with pytest.raises(qd.QdiffError, match="QubitUnitary: a gate matrix that requires grad is "
                                            "only differentiable with diff_method='backprop'"):
        grads("mixed", "parameter-shift", True)


@pytest.mark.parametrize("method", ["backprop", "best", "parameter-shift"])
def test_gate_matrix_under_torch_func_forward_mode_is_refused_not_dropped(method):
    """A QubitUnitary matrix computed from an argument carries a torch.func tangent under
    jacfwd/jvp (no requires_grad there) or an outer level's derivative under nested
    transforms: refused by name, never a zero; a constant matrix made in the call runs."""
    def ry(a):
        c, s = torch.cos(a / 2), torch.sin(a / 2)
        return torch.stack([torch.stack([c, -s]), torch.stack([s, c])]).to(torch.complex128)

    @qd.qnode(qd.device("mixed", wires=1), diff_method=method)
    def f(a, w):
        qd.QubitUnitary(ry(a), wires=0)
        qd.RX(w, wires=0)
        return qd.expval(qd.Z(0))

    @qd.qnode(qd.device("mixed", wires=1), diff_method=method)
    def g(w):
        qd.QubitUnitary(ry(torch.tensor(0.7, dtype=torch.float64)), wires=0)
        qd.RX(w, wires=0)
        return qd.expval(qd.Z(0))

    a = torch.tensor(0.7, dtype=torch.float64)
    w = torch.tensor(0.3, dtype=torch.float64)
    for run in (lambda: torch.func.jacfwd(f)(a, w),
                lambda: torch.func.jvp(f, (a, w), (torch.ones_like(a), torch.zeros_like(w))),
                lambda: torch.func.jacfwd(torch.func.grad(f, 1), 0)(a, w)):
        with pytest.raises(qd.QdiffError, match="QubitUnitary: a gate matrix"):
            run()
    want = -math.cos(0.7) * math.sin(0.3)
    assert abs(float(torch.func.jacrev(g)(w)) - want) < 1e-10
    assert abs(float(torch.func.jacfwd(g)(w)) - want) < 1e-10


def test_shots_of_one_basis_read_one_draw_readout_errors_apart():
    """With readout errors, probs/sample/counts of wires and sample(op) read one draw through
    them, expval and var another, of the state itself: each group's values come from the
    same bits."""
    m = qd.noise.NoiseModel().add_readout(0, 0.2, 0.1).add_readout(1, 0.05, 0.3)
    dev = qd.device("mixed", wires=2, noise=m, shots=500, seed=1)

    @qd.qnode(dev)
    def f():
        qd.Hadamard(0)
        qd.CNOT(wires=[0, 1])
        qd.BitFlip(0.2, wires=1)
        return (qd.probs(wires=[0, 1]), qd.sample(wires=[0, 1]), qd.sample(qd.Z(0) @ qd.Z(1)),
                qd.expval(qd.Z(0) @ qd.Z(1)), qd.var(qd.Z(0) @ qd.Z(1)))
    p, bits, zz, e, v = f()
    idx = bits[:, 0] * 2 + bits[:, 1]
    torch.testing.assert_close(p, torch.stack([(idx == k).double().mean() for k in range(4)]),
                               atol=1e-12, rtol=0)
    b = 1 - 2 * bits.double()
    torch.testing.assert_close(zz, b[:, 0] * b[:, 1], atol=1e-12, rtol=0)
    torch.testing.assert_close(v, 1 - e ** 2, atol=1e-12, rtol=0)
    # expval reads the state, not the readout errors: 0.6, not 0.6 * 0.6 * 0.5 (within 5 sd)
    assert abs(float(e) - 0.6) < 5 * 0.8 / 500 ** 0.5


def test_best_takes_backprop_where_the_reverse_mode_would_hold_a_wide_gates_environment():
    """A trainable gate on every wire holds 16**n entries in the reverse mode (20 GiB at 7
    qubits) where backprop holds density matrices: ``best`` takes backprop there, with the
    gradient backprop gives; a circuit of one- and two-wire blocks keeps the reverse mode."""
    n = 7
    dev = qd.device("mixed", wires=n)

    def wide(x):
        for w in range(n):
            qd.RY(2.2 + 0.1 * w, wires=w)
        qd.ctrl(qd.PauliRot, control=[0, 1, 2])(x, "XYZX", wires=[3, 4, 5, 6])
        return qd.expval(qd.Z(3) @ qd.Z(0))

    best = qd.qnode(dev, diff_method="best")(wide)
    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    assert qd.specs(best)(x)["gradient_method"] == "backprop"
    (g,) = torch.autograd.grad(best(x), x)
    (g_ref,) = torch.autograd.grad(qd.qnode(dev, diff_method="backprop")(wide)(x), x)
    assert abs(float(g_ref)) > 1e-3 and torch.allclose(g, g_ref, atol=1e-12)

    def narrow(x):
        qd.RY(x, wires=0)
        qd.CNOT(wires=[0, 1])
        return qd.expval(qd.Z(1))
    assert qd.specs(qd.qnode(dev, diff_method="best")(narrow))(x)["gradient_method"] == "adjoint"
