"""The compiler facts on each Gate record, checked against the gates' own matrices."""
import numpy as np
import pytest

from qdiff.circuits.gates import GATES

_X = np.array([[0, 1], [1, 0]], dtype=complex)
_Z = np.diag([1.0, -1.0]).astype(complex)


def _m(gate, *angles):
    return gate.matrix(*angles).detach().numpy()


def _same_up_to_phase(a, b):
    t = np.vdot(b, a)
    return np.allclose(a, (t / abs(t)) * b, atol=1e-12)


def _pauli_on(p, wire, k):
    out = np.eye(1, dtype=complex)
    for w in range(k):
        out = np.kron(out, p if w == wire else np.eye(2))
    return out


ANGLES = (0.37, -1.2, 2.1)


@pytest.mark.parametrize("name", sorted(n for n, g in GATES.items() if g.wire_axes))
def test_wire_axes_commute_with_the_pauli(name):
    g = GATES[name]
    u = _m(g, *ANGLES[:g.num_params])
    for w, axis in enumerate(g.wire_axes):
        if axis:
            p = _pauli_on(_Z if axis == "z" else _X, w, g.num_wires)
            assert np.allclose(u @ p, p @ u, atol=1e-12), (name, w)


@pytest.mark.parametrize("name", sorted(n for n, g in GATES.items() if g.axis_angle is not None))
def test_axis_angle_is_the_rotation(name):
    g = GATES[name]
    rot = GATES["rz" if g.wire_axes == ("z",) else "rx"]
    assert _same_up_to_phase(_m(g), _m(rot, g.axis_angle))


@pytest.mark.parametrize("name", sorted(n for n, g in GATES.items() if g.additive))
def test_additive_angles_add(name):
    g = GATES[name]
    assert np.allclose(_m(g, 0.3) @ _m(g, -1.1), _m(g, -0.8), atol=1e-12)


def _swap01(i: int, k: int) -> int:
    """Index ``i`` with the bits of wires 0 and 1 exchanged (wire 0 most significant)."""
    b0, b1 = (i >> (k - 1)) & 1, (i >> (k - 2)) & 1
    return i ^ ((b0 ^ b1) << (k - 1)) ^ ((b0 ^ b1) << (k - 2))


@pytest.mark.parametrize("name", sorted(n for n, g in GATES.items() if g.symmetric))
def test_symmetric_gates_ignore_wire_order(name):
    g = GATES[name]
    u = _m(g, *ANGLES[:g.num_params])
    perm = [_swap01(i, g.num_wires) for i in range(2 ** g.num_wires)]
    assert np.allclose(u[np.ix_(perm, perm)], u, atol=1e-12)


@pytest.mark.parametrize("name", sorted(n for n, g in GATES.items() if g.zyz is not None))
def test_zyz_angles_rebuild_the_gate(name):
    g = GATES[name]
    ps = ANGLES[:g.num_params]
    a, b, c = g.zyz(ps)
    rz, ry = GATES["rz"], GATES["ry"]
    assert _same_up_to_phase(_m(g, *ps), _m(rz, c) @ _m(ry, b) @ _m(rz, a))


@pytest.mark.parametrize("name", sorted(n for n, g in GATES.items()
                                        if g.num_params == 1 and g.generators is not None))
def test_one_parameter_builtins_have_their_generator_on_the_left(name):
    """``i dU/dphi U^dag = G`` at several angles: the form the reverse modes take for built-in
    one-parameter records without checking them (``generator_on_left``)."""
    from qdiff.circuits.gates import check_generator
    g = GATES[name]
    gen = np.asarray(g.generators[0])
    h = 1e-5
    for phi in ANGLES:
        du = (_m(g, phi + h) - _m(g, phi - h)) / (2 * h)
        assert np.allclose(1j * du @ _m(g, phi).conj().T, gen, atol=1e-8), name
    check_generator(g, 0)
