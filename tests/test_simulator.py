"""The torch statevector simulator against PennyLane ``default.qubit`` and a dense reference.

Random circuits mix every registered gate (plus MultiRZ, PauliRot, QubitUnitary) with every
exact measurement type (expval of Pauli words, Hermitian matrices, Hamiltonians and Hadamard,
var, probs of wire subsets in arbitrary order, state), batched and unbatched, on the autograd
path (parameters require grad), the in-place no-grad path, and in complex64.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qdiff as qd
from conftest import random_unitary
from qdiff.backends.statevector import kernels
from qdiff.backends.statevector.apply import apply_gate, gate_matrix, op_angles
from qdiff.backends.statevector.simulate import evolve, simulate
from qdiff.circuits import Circuit, Operation, ParamRef
from qdiff.circuits.gates import GATES, multirz_gate, paulirot_gate, unitary_gate

_PL_ADJOINT = {"sdg": "S", "tdg": "T", "sxdg": "SX", "iswapdg": "ISWAP"}
GATE_NAMES = list(GATES) + ["multirz", "paulirot", "unitary"]
N_CIRCUITS = 210
CHUNK = 21


# ---------------------------------------------------------------------------------------------
# random circuit specs, consumed by both qdiff and PennyLane

def random_spec(seed: int, batch: int | None):
    """``(n, ops, meas)``: ops ``(name, wires, params, extra)``; params floats or ``(B,)`` arrays.

    Gates are drawn round-robin from a seeded permutation so every gate appears across seeds.
    """
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 6)) if seed % 3 else 3
    names = [GATE_NAMES[(seed * 7 + i) % len(GATE_NAMES)] for i in range(6)]
    names += list(rng.choice(GATE_NAMES, size=int(rng.integers(4, 9))))
    rng.shuffle(names)
    ops = []
    for name in names:
        extra = None
        if name == "multirz":
            k = int(rng.integers(1, n + 1))
            num_params = 1
        elif name == "paulirot":
            k = int(rng.integers(1, n + 1))
            extra = "".join(rng.choice(list("IXYZ"), size=k))
            num_params = 1
        elif name == "unitary":
            k = int(rng.integers(1, 3))
            extra = random_unitary(2 ** k, torch.Generator().manual_seed(seed)).numpy()
            num_params = 0
        else:
            k, num_params = GATES[name].num_wires, GATES[name].num_params
        if k > n:
            continue
        wires = [int(w) for w in rng.permutation(n)[:k]]
        params = []
        for _ in range(num_params):
            if batch and rng.random() < 0.7:
                params.append(rng.uniform(-math.pi, math.pi, size=batch))
            else:
                params.append(float(rng.uniform(-math.pi, math.pi)))
        ops.append((name, wires, params, extra))
    return n, ops, random_measurements(rng, n)


def random_measurements(rng, n):
    def word():
        k = int(rng.integers(1, n + 1))
        wires = [int(w) for w in rng.permutation(n)[:k]]
        return [(str(rng.choice(list("XYZ"))), w) for w in wires]

    def herm(k):
        a = rng.normal(size=(2 ** k, 2 ** k)) + 1j * rng.normal(size=(2 ** k, 2 ** k))
        return a + a.conj().T

    def obs():
        kind = rng.integers(0, 5)
        if kind == 0:
            return ("word", word())
        if kind == 1:
            k = int(rng.integers(1, 3))
            return ("herm", herm(k), [int(w) for w in rng.permutation(n)[:k]])
        if kind == 2:
            return ("ham", list(rng.normal(size=3)), [word() for _ in range(3)])
        if kind == 3:
            return ("had", int(rng.integers(0, n)))
        # a Hermitian factor times a Pauli on another wire
        w = [int(x) for x in rng.permutation(n)[:2]]
        return ("hermword", herm(1), w[0], (str(rng.choice(list("XYZ"))), w[1]))

    k = int(rng.integers(1, n + 1))
    return [("expval", obs()), ("expval", obs()), ("var", obs()),
            ("probs", [int(w) for w in rng.permutation(n)[:k]]), ("state",)]


# -- qdiff side ------------------------------------------------------------------------------

def qd_obs(o):
    kind = o[0]
    if kind == "word":
        out = None
        for letter, w in o[1]:
            f = getattr(qd, letter)(w)
            out = f if out is None else out @ f
        return out
    if kind == "herm":
        return qd.Hermitian(torch.tensor(o[1]), wires=o[2])
    if kind == "ham":
        return qd.Hamiltonian(o[1], [qd_obs(("word", w)) for w in o[2]])
    if kind == "had":
        return qd.H(o[1])
    return qd.Hermitian(torch.tensor(o[1]), wires=[o[2]]) @ getattr(qd, o[3][0])(o[3][1])


def run_qdiff(spec, dtype=torch.complex128, requires_grad=False, no_grad=False, device="cpu",
              rdtype=torch.float64):
    """The spec's circuit as a qdiff qnode (backprop); angles and matrices made on ``device``
    in ``rdtype`` (the qnode follows them)."""
    n, ops, meas = spec
    dev = qd.device("statevector", wires=n, dtype=dtype)
    params = [[torch.tensor(p, dtype=rdtype, device=device, requires_grad=requires_grad)
               for p in op[2]] for op in ops]

    @qd.qnode(dev, diff_method="backprop")
    def circuit():
        for (name, wires, _, extra), ps in zip(ops, params):
            if name == "multirz":
                qd.MultiRZ(*ps, wires=wires)
            elif name == "paulirot":
                qd.PauliRot(*ps, extra, wires=wires)
            elif name == "unitary":
                qd.QubitUnitary(torch.tensor(extra, device=device), wires=wires)
            else:
                GATES[name](*ps, wires=wires)
        out = []
        for m in meas:
            if m[0] in ("expval", "var"):
                out.append(getattr(qd, m[0])(qd_obs(m[1])))
            elif m[0] == "probs":
                out.append(qd.probs(wires=m[1]))
            else:
                out.append(qd.state())
        return out

    if no_grad:
        with torch.no_grad():
            return circuit(), params
    return circuit(), params


# -- PennyLane side --------------------------------------------------------------------------

def pl_obs(o):
    import pennylane as qml
    kind = o[0]
    letters = {"X": qml.PauliX, "Y": qml.PauliY, "Z": qml.PauliZ}
    if kind == "word":
        return qml.prod(*[letters[l](w) for l, w in o[1]]) if len(o[1]) > 1 else \
            letters[o[1][0][0]](o[1][0][1])
    if kind == "herm":
        return qml.Hermitian(o[1], wires=o[2])
    if kind == "ham":
        return qml.Hamiltonian(o[1], [pl_obs(("word", w)) for w in o[2]])
    if kind == "had":
        return qml.Hadamard(o[1])
    return qml.prod(qml.Hermitian(o[1], wires=[o[2]]), letters[o[3][0]](o[3][1]))


def pl_gate(name, wires, params, extra):
    import pennylane as qml
    if name == "multirz":
        return qml.MultiRZ(*params, wires=wires)
    if name == "paulirot":
        return qml.PauliRot(*params, extra, wires=wires)
    if name == "unitary":
        return qml.QubitUnitary(extra, wires=wires)
    if name in _PL_ADJOINT:
        return qml.adjoint(getattr(qml, _PL_ADJOINT[name])(wires=wires))
    return getattr(qml, GATES[name].pl_name)(*params, wires=wires)


def run_pennylane(spec, interface=None, params=None):
    import pennylane as qml
    n, ops, meas = spec
    dev = qml.device("default.qubit", wires=n)

    @qml.qnode(dev, interface=interface)
    def circuit(ps):
        for (name, wires, _, extra), p in zip(ops, ps):
            pl_gate(name, wires, p, extra)
        out = []
        for m in meas:
            if m[0] == "expval":
                out.append(qml.expval(pl_obs(m[1])))
            elif m[0] == "var":
                out.append(qml.var(pl_obs(m[1])))
            elif m[0] == "probs":
                out.append(qml.probs(wires=m[1]))
            else:
                out.append(qml.state())
        return out

    ps = params if params is not None else [[np.asarray(p) for p in op[2]] for op in ops]
    return circuit(ps)


def compare(ours, theirs, atol):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        b = np.asarray(b)
        assert a.shape == b.shape, (a.shape, b.shape)
        assert np.allclose(a, b, atol=atol, rtol=0), np.abs(a - b).max()


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", range(N_CIRCUITS // CHUNK))
def test_random_circuits_match_pennylane(chunk):
    for seed in range(chunk * CHUNK, (chunk + 1) * CHUNK):
        batch = 3 if seed % 2 else None
        spec = random_spec(seed, batch)
        ref = run_pennylane(spec)
        grad_out, params = run_qdiff(spec, requires_grad=True)
        if any(params):
            assert all(o.requires_grad for o in grad_out)
        compare(grad_out, ref, 1e-10)
        inplace_out, _ = run_qdiff(spec, no_grad=True)
        compare(inplace_out, ref, 1e-10)
        if seed % 5 == 0:
            c64, _ = run_qdiff(spec, dtype=torch.complex64)
            compare(c64, ref, 2e-4)


def test_random_circuits_cover_every_gate():
    used = set()
    for seed in range(N_CIRCUITS):
        used |= {op[0] for op in random_spec(seed, 3 if seed % 2 else None)[1]}
    assert used == set(GATE_NAMES)


@pytest.mark.parametrize("seed", [1, 4, 8, 13])
def test_backprop_gradients_match_pennylane(seed):
    spec = random_spec(seed, None)
    n, ops, meas = spec
    spec = (n, ops, [m for m in meas if m[0] in ("expval", "var")])
    out, params = run_qdiff(spec, requires_grad=True)
    flat = [p for ps in params for p in ps]
    if not flat:
        pytest.skip("no parameters drawn")
    out.sum().backward()
    ours = np.array([float(p.grad) for p in flat])

    import pennylane as qml
    tparams = [[torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in op[2]]
               for op in ops]
    res = run_pennylane(spec, interface="torch", params=tparams)
    sum(res).backward()
    theirs = np.array([float(p.grad) for ps in tparams for p in ps])
    assert np.allclose(ours, theirs, atol=1e-9)
    del qml


# ---------------------------------------------------------------------------------------------
# kernels against a dense reference

def dense_apply(state: np.ndarray, u: np.ndarray, wires, n: int) -> np.ndarray:
    """``(B, 2**n)`` state times a ``(B' , 2**k, 2**k)`` matrix on ``wires`` (numpy reference)."""
    k = len(wires)
    b = state.shape[0]
    s = state.reshape([b] + [2] * n)
    u = np.broadcast_to(u, (b,) + u.shape[1:]).reshape([b] + [2] * (2 * k))
    s = np.moveaxis(s, [1 + w for w in wires], list(range(1, k + 1)))
    s = np.einsum(u, [0] + list(range(1, 2 * k + 1)),
                  s, [0] + list(range(k + 1, 2 * k + 1)) + list(range(2 * k + 1, 2 * k + 1 + n - k)),
                  [0] + list(range(1, k + 1)) + list(range(2 * k + 1, 2 * k + 1 + n - k)))
    s = np.moveaxis(s, list(range(1, k + 1)), [1 + w for w in wires])
    return s.reshape(b, 2 ** n)


def all_gate_instances():
    out = list(GATES.values()) + [multirz_gate(3), paulirot_gate("XZY"),
                                  unitary_gate(random_unitary(4, torch.Generator().manual_seed(3)))]
    return out


@pytest.mark.parametrize("gate", all_gate_instances(), ids=lambda g: g.name)
@pytest.mark.parametrize("batch,pbatch", [(1, 1), (3, 1), (3, 3)])
def test_apply_gate_matches_dense(gate, batch, pbatch, gen):
    n = 5
    state = torch.randn(batch, 2 ** n, dtype=torch.complex128, generator=gen)
    wires = tuple(int(w) for w in torch.randperm(n, generator=gen)[:gate.num_wires])
    angles = [torch.rand(pbatch, dtype=torch.float64, generator=gen) * 6 - 3
              for _ in range(gate.num_params)]
    u = gate_matrix(gate, angles, torch.complex128, "cpu")
    expected = dense_apply(state.numpy(), u.numpy(), wires, n)
    out = apply_gate(state, gate, wires, angles, n, inplace=False)
    assert np.allclose(out.numpy(), expected, atol=1e-12)
    s2 = state.clone()
    out2 = apply_gate(s2, gate, wires, angles, n, inplace=True)
    assert np.allclose(out2.numpy(), expected, atol=1e-12)


def random_circuit(n: int, depth: int, seed: int) -> Circuit:
    """A Circuit over all gates with ParamRefs (scale/offset) and constants."""
    rng = np.random.default_rng(seed)
    ops, p = [], 0
    gates = all_gate_instances()
    for _ in range(depth):
        g = gates[int(rng.integers(len(gates)))]
        if g.num_wires > n:
            continue
        wires = tuple(int(w) for w in rng.permutation(n)[:g.num_wires])
        params = []
        for _ in range(g.num_params):
            if rng.random() < 0.8:
                params.append(ParamRef(p, float(rng.normal()), float(rng.normal())))
                p += 1
            else:
                params.append(float(rng.normal()))
        ops.append(Operation(g, wires, tuple(params)))
    return Circuit(n, tuple(ops), (), p)


def dense_simulate(circuit: Circuit, theta: torch.Tensor) -> np.ndarray:
    n = circuit.num_wires
    b = theta.shape[0]
    s = np.zeros((b, 2 ** n), dtype=complex)
    s[:, 0] = 1
    for op in circuit.operations:
        u = gate_matrix(op.gate, op_angles(op, theta, torch.float64), torch.complex128, "cpu")
        s = dense_apply(s, u.numpy(), op.wires, n)
    return s


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fuse", [True, False])
def test_simulate_modes_match_dense(seed, fuse):
    n = 4 + seed % 3
    c = random_circuit(n, 40, seed)
    theta = torch.randn(3, c.num_params, dtype=torch.float64)
    ref = dense_simulate(c, theta)
    with torch.no_grad():
        inplace = simulate(c, theta, fuse=fuse)
    t = theta.clone().requires_grad_(True)
    functional = simulate(c, t, fuse=fuse)
    assert functional.requires_grad
    assert np.allclose(inplace.numpy(), ref, atol=1e-11)
    assert np.allclose(functional.detach().numpy(), ref, atol=1e-11)
    c64 = simulate(c, theta, cdtype=torch.complex64, fuse=fuse)
    assert c64.dtype == torch.complex64
    assert np.allclose(c64.numpy(), ref, atol=2e-5)


def test_simulate_from_initial_state(gen):
    c = random_circuit(4, 20, 11)
    theta = torch.randn(2, c.num_params, dtype=torch.float64)
    psi = torch.randn(2, 16, dtype=torch.complex128, generator=gen)
    psi = psi / psi.norm(dim=-1, keepdim=True)
    ref = psi.numpy()
    for op in c.operations:
        u = gate_matrix(op.gate, op_angles(op, theta, torch.float64), torch.complex128, "cpu")
        ref = dense_apply(ref, u.numpy(), op.wires, 4)
    out = simulate(c, theta, initial_state=psi)
    assert np.allclose(out.numpy(), ref, atol=1e-11)
    psi_copy = psi.clone()
    simulate(c, theta, initial_state=psi)
    assert torch.equal(psi, psi_copy), "the in-place path must not overwrite the caller's state"


def test_evolve_is_differentiable_and_matches_inplace():
    c = random_circuit(5, 50, 21)
    theta = torch.randn(2, c.num_params, dtype=torch.float64, requires_grad=True)
    from qdiff.backends.statevector.simulate import zero_state
    s_grad = evolve(zero_state(5, 2, torch.complex128, "cpu"), c.operations, theta, 5,
                    torch.float64, inplace=False)
    with torch.no_grad():
        s_ip = evolve(zero_state(5, 2, torch.complex128, "cpu"), c.operations, theta, 5,
                      torch.float64, inplace=True)
    assert torch.allclose(s_grad.detach(), s_ip, atol=1e-12)
    # gradient of a real functional against central finite differences in one random direction
    w = torch.randn(2, 32, dtype=torch.float64)
    f = lambda th: (evolve(zero_state(5, 2, torch.complex128, "cpu"), c.operations, th, 5,
                           torch.float64, inplace=False).abs() ** 2 * w).sum()
    (g,) = torch.autograd.grad(f(theta), theta)
    d = torch.randn_like(theta)
    h = 1e-6
    with torch.no_grad():
        fd = (f(theta + h * d) - f(theta - h * d)) / (2 * h)
    assert abs(float((g * d).sum()) - float(fd)) < 1e-6


def test_kernels_one_qubit_inplace_matches_functional(gen):
    s = torch.randn(2, 64, dtype=torch.complex128, generator=gen)
    u = random_unitary(2, gen).unsqueeze(0)
    for w in range(6):
        a = kernels.apply_one_qubit(s, u, w, 6, inplace=False)
        b = kernels.apply_one_qubit(s.clone(), u, w, 6, inplace=True)
        assert torch.allclose(a, b, atol=1e-14)
        assert np.allclose(a.numpy(), dense_apply(s.numpy(), u.numpy(), [w], 6), atol=1e-12)


@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("seed", range(4))
def test_block_fusion_matches_dense(k, seed):
    """evolve(fuse=k): windowed k-qubit blocks (no-grad path) equal the gate-by-gate result,
    batched and unbatched, on states large enough that blocks are really applied."""
    from qdiff.backends.statevector.fusion import plan_blocks
    from qdiff.backends.statevector.simulate import zero_state
    n = 9
    c = random_circuit(n, 80, 100 + seed)
    theta = torch.randn(2 if seed % 2 else 1, c.num_params, dtype=torch.float64)
    ref = dense_simulate(c, theta)
    plan = plan_blocks(c.operations, k)
    assert sorted(id(o) for _, ops in plan for o in ops) == sorted(id(o) for o in c.operations)
    assert any(len(ops) > 1 for _, ops in plan)
    with torch.no_grad():
        out = evolve(zero_state(n, theta.shape[0], torch.complex128, "cpu"), c.operations, theta,
                     n, torch.float64, inplace=True, fuse=k)
    assert np.allclose(out.numpy(), ref, atol=1e-11)


@pytest.mark.parametrize("k", [2, 3])
def test_block_fusion_applies_a_gate_wider_than_the_window_alone(k, monkeypatch):
    """fuse=k: a gate whose wires span more than k wires (IsingXX(0, 11)) is applied by its own
    kernel, not as a dense block over its span (4**12 entries), with the dense result."""
    from qdiff.backends.statevector import fusion
    widths = []
    block = fusion.block_matrix
    monkeypatch.setattr(fusion, "block_matrix",
                        lambda ops, wires, *a: widths.append(len(wires)) or block(ops, wires, *a))
    n = 12
    ops = (Operation(GATES["h"], (0,)), Operation(GATES["ry"], (11,), (ParamRef(0),)),
           Operation(GATES["rxx"], (0, 11), (ParamRef(1),)),
           Operation(GATES["iswap"], (1, 10)), Operation(GATES["rx"], (10,), (ParamRef(2),)),
           Operation(GATES["ry"], (11,), (ParamRef(0),)), Operation(GATES["cz"], (10, 11)))
    c = Circuit(n, ops, num_params=3)
    theta = torch.tensor([[0.3, -1.1, 0.7], [2.0, 0.4, -0.2]], dtype=torch.float64)
    ref = dense_simulate(c, theta)
    with torch.no_grad():
        out = simulate(c, theta, fuse=k)
    assert np.allclose(out.numpy(), ref, atol=1e-12)
    assert widths and max(widths) <= k


@pytest.mark.parametrize("fuse", [0, 1, -1, 7, 20, 2.5, "3", None])
def test_device_refuses_a_fuse_outside_its_range(fuse):
    with pytest.raises(qd.QdiffError, match="fuse="):
        qd.device("statevector", wires=3, fuse=fuse)


@pytest.mark.parametrize("fuse", [True, False, 2, 6, np.int64(3)])
def test_device_fuse_values_match_dense(fuse):
    c = random_circuit(7, 40, 5)
    theta = torch.randn(2, c.num_params, dtype=torch.float64)
    dev = qd.device("statevector", wires=7, fuse=fuse)
    with torch.no_grad():
        out = dev.final_state(c, theta)
    assert np.allclose(out.numpy(), dense_simulate(c, theta), atol=1e-11)


def test_block_plan_keeps_the_order_of_gates_sharing_a_wire():
    from qdiff.backends.statevector.fusion import plan_blocks
    c = random_circuit(8, 200, 7)
    for k in (2, 3, 4, 6):
        order = [o for _, ops in plan_blocks(c.operations, k) for o in ops]
        pos = {id(o): i for i, o in enumerate(order)}
        for i, a in enumerate(c.operations):
            for b in c.operations[i + 1:]:
                if set(a.wires) & set(b.wires):
                    assert pos[id(a)] < pos[id(b)]
        for wires, ops in plan_blocks(c.operations, k):
            if len(ops) > 1:
                assert list(wires) == list(range(wires[0], wires[-1] + 1)) and len(wires) <= k


@pytest.mark.parametrize("cdtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_single_precision_qubit_unitary_runs(k, cdtype):
    """A QubitUnitary given in complex64 (unitary to its rounding, ~1e-7) is taken, on either
    device precision, and acts as the dense product of its matrix on the given wires."""
    n = 4
    u = random_unitary(2 ** k, torch.Generator().manual_seed(k)).to(torch.complex64)
    wires = [3, 0, 2][:k]
    dev = qd.device("statevector", wires=n, dtype=cdtype)

    @qd.qnode(dev)
    def f():
        for w in range(n):
            qd.H(w)
        qd.QubitUnitary(u, wires=wires)
        return qd.state()
    s = np.full((2,) * n, 0.25, dtype=complex)
    s = np.tensordot(u.numpy().astype(complex).reshape((2,) * (2 * k)), s,
                     axes=(list(range(k, 2 * k)), wires))
    s = np.transpose(s, np.argsort(wires + [w for w in range(n) if w not in wires]))
    assert np.allclose(f().numpy(), s.reshape(-1), atol=1e-6)


def test_unitary_tolerance_follows_the_precision_the_values_carry():
    """|U^dag U - I| is checked against 1e-6 (PennyLane's unitarity check), or single-precision
    rounding when the values are single precision (given as complex64, or float32 values
    stored as complex128); beyond that the matrix is refused."""
    from qdiff.circuits.gates import unitary_tolerance
    u = random_unitary(8, torch.Generator().manual_seed(4))
    single = u.to(torch.complex64).to(torch.complex128)
    assert unitary_tolerance(u, d=8) == 1e-6
    assert unitary_tolerance(single, d=8) == unitary_tolerance(u.to(torch.complex64), d=8) \
        == 64 * 8 * torch.finfo(torch.float32).eps
    rounded = torch.tensor([[0.7071068, 0.7071068], [0.7071068, -0.7071068]],
                           dtype=torch.complex128)  # 7 digits: 1.1e-7 from unitary
    for m in (single, rounded):
        dev = qd.device("statevector", wires=3)

        @qd.qnode(dev)
        def f():
            qd.QubitUnitary(m, wires=list(range(m.shape[0].bit_length() - 1)))
            return qd.expval(qd.Z(0))
        f()
    with pytest.raises(qd.QdiffError, match=r"not unitary \(\|U\^dag U - I\| = 2e-05, "
                                            r"tolerance 1e-06\)"):
        qd.QubitUnitary(torch.tensor([[1.0, 0], [0, 1.00001]], dtype=torch.complex128),
                        wires=[0])


def test_fusion_module_exports_exist():
    import qdiff.backends.statevector.fusion as fusion
    assert all(hasattr(fusion, name) for name in fusion.__all__)
