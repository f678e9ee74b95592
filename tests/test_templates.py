"""Templates against PennyLane's templates of the same name (final states compared exactly)."""
from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch

import qdiff as qd


def qd_state(n, body):
    dev = qd.device("statevector", wires=n)

    @qd.qnode(dev)
    def f():
        body()
        return qd.state()
    return f().detach().numpy()


def pl_state(n, body):
    dev = qml.device("default.qubit", wires=n)

    @qml.qnode(dev)
    def f():
        body()
        return qml.state()
    return np.asarray(f())


def rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-np.pi, np.pi, size=shape)


def prefix(n):
    """Break the symmetry of |0...0> so that every template acts on a generic state."""
    ang = rand(n, seed=99)
    return (lambda: [qd.RY(float(a), wires=i) for i, a in enumerate(ang)],
            lambda: [qml.RY(float(a), wires=i) for i, a in enumerate(ang)])


@pytest.mark.parametrize("rotation", ["X", "Y", "Z"])
@pytest.mark.parametrize("n_features", [2, 3])
def test_angle_embedding(rotation, n_features):
    x = rand(n_features, seed=1)
    a, b = prefix(3)
    ours = qd_state(3, lambda: (a(), qd.AngleEmbedding(torch.tensor(x), wires=range(3), rotation=rotation)))
    theirs = pl_state(3, lambda: (b(), qml.AngleEmbedding(x, wires=range(3), rotation=rotation)))
    assert np.allclose(ours, theirs, atol=1e-12)


@pytest.mark.parametrize("kw,length", [(dict(normalize=True), 8), (dict(pad_with=0.3, normalize=True), 5),
                                        (dict(), 8)])
def test_amplitude_embedding(kw, length):
    x = np.random.default_rng(2).normal(size=length)
    if not kw.get("normalize"):
        x = x / np.linalg.norm(x)
    ours = qd_state(3, lambda: (qd.AmplitudeEmbedding(torch.tensor(x), wires=range(3), **kw), qd.H(1)))
    theirs = pl_state(3, lambda: (qml.AmplitudeEmbedding(x, wires=range(3), **kw), qml.Hadamard(1)))
    assert np.allclose(ours, theirs, atol=1e-12)


@pytest.mark.parametrize("pad", [0.5j, np.complex128(0.2 - 0.1j), 0.25])
def test_amplitude_embedding_pads_with_a_complex_or_real_number(pad):
    x = np.random.default_rng(4).normal(size=5) + 1j * np.random.default_rng(5).normal(size=5)
    ours = qd_state(3, lambda: (qd.AmplitudeEmbedding(torch.tensor(x), wires=range(3),
                                                      pad_with=pad, normalize=True), qd.H(1)))
    theirs = pl_state(3, lambda: (qml.AmplitudeEmbedding(x, wires=range(3), pad_with=pad,
                                                         normalize=True), qml.Hadamard(1)))
    assert np.allclose(ours, theirs, atol=1e-12)


@pytest.mark.parametrize("kw,pattern", [
    (dict(features=[0.6, 0.8, 0.0], pad_with="a"), "pad_with"),
    (dict(features=[0.6, 0.8, 0.0], pad_with=float("nan")), "pad_with"),
    (dict(features=[1.0, 0.0, 0.0, 0.0], wires=[0, 0]), "repeated wire"),
    (dict(features=[float("nan"), 0.0, 0.0, 0.0], normalize=True), "finite"),
    (dict(features=0.5), "features"),
])
def test_amplitude_embedding_refuses_bad_input_by_name(kw, pattern):
    kw = {"wires": [0, 1], **kw}
    feats = torch.tensor(kw.pop("features"), dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match=pattern):
        qd_state(2, lambda: qd.AmplitudeEmbedding(feats, **kw))


def test_amplitude_embedding_padding_is_checked_against_the_memory_budget(monkeypatch):
    """A few features padded to the amplitudes of many wires: the padding's size is
    checked before it is allocated (recording alone, as for drawing, allocates it)."""
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1M")
    f = qd.qnode(qd.device("statevector", wires=20))(
        lambda: (qd.AmplitudeEmbedding([1.0], wires=range(20), pad_with=0.0), qd.probs())[1])
    with pytest.raises(qd.QdiffMemoryError, match="AmplitudeEmbedding: padding 1 features"):
        qd.draw(f)()


def test_amplitude_embedding_on_a_wire_subset():
    x = np.random.default_rng(3).normal(size=4)
    x = x / np.linalg.norm(x)
    ours = qd_state(3, lambda: qd.AmplitudeEmbedding(torch.tensor(x), wires=[2, 0]))
    theirs = pl_state(3, lambda: qml.StatePrep(x, wires=[2, 0]))
    assert np.allclose(ours, theirs, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("rotation", [None, "RY"])
def test_basic_entangler_layers(n, rotation):
    w = rand(*qd.BasicEntanglerLayers.shape(n_layers=2, n_wires=n), seed=4)
    assert qd.BasicEntanglerLayers.shape(2, n) == qml.BasicEntanglerLayers.shape(2, n)
    a, b = prefix(n)
    ours = qd_state(n, lambda: (a(), qd.BasicEntanglerLayers(
        torch.tensor(w), wires=range(n), rotation=getattr(qd, rotation) if rotation else None)))
    theirs = pl_state(n, lambda: (b(), qml.BasicEntanglerLayers(
        w, wires=range(n), rotation=getattr(qml, rotation) if rotation else qml.RX)))
    assert np.allclose(ours, theirs, atol=1e-12)


@pytest.mark.parametrize("n,layers,ranges", [(2, 2, None), (3, 3, None), (5, 4, None),
                                             (4, 2, [3, 2]), (4, 3, [1, 1, 3])])
def test_strongly_entangling_layers(n, layers, ranges):
    shape = qd.StronglyEntanglingLayers.shape(n_layers=layers, n_wires=n)
    assert shape == qml.StronglyEntanglingLayers.shape(n_layers=layers, n_wires=n)
    w = rand(*shape, seed=5)
    ours = qd_state(n, lambda: qd.StronglyEntanglingLayers(torch.tensor(w), wires=range(n), ranges=ranges))
    theirs = pl_state(n, lambda: qml.StronglyEntanglingLayers(w, wires=range(n), ranges=ranges))
    assert np.allclose(ours, theirs, atol=1e-12)


def test_strongly_entangling_layers_batched_weights():
    w = rand(3, 2, 3, 3, seed=6)
    dev = qd.device("statevector", wires=3)

    @qd.qnode(dev)
    def f(w):
        qd.StronglyEntanglingLayers(w, wires=range(3))
        return qd.state()
    out = f(torch.tensor(w)).numpy()
    assert out.shape == (3, 8)
    for i in range(3):
        ref = pl_state(3, lambda: qml.StronglyEntanglingLayers(w[i], wires=range(3)))
        assert np.allclose(out[i], ref, atol=1e-12)


@pytest.mark.parametrize("bits", [[1, 0, 1], [0, 0, 0], [1, 1, 0, 1]])
def test_basis_state(bits):
    n = len(bits)
    ours = qd_state(n, lambda: qd.BasisState(bits, wires=range(n)))
    theirs = pl_state(n, lambda: qml.BasisState(np.array(bits), wires=range(n)))
    assert np.allclose(ours, theirs, atol=1e-12)


@pytest.mark.parametrize("value,wires", [(3, [0, 1]), (1, [2, 0, 1]), (np.int64(6), [0, 1, 2]),
                                         (torch.tensor(5), [1, 2, 0]), (0, [1])])
def test_basis_state_takes_pennylanes_integer_form(value, wires):
    ours = qd_state(3, lambda: qd.BasisState(value, wires=wires))
    theirs = pl_state(3, lambda: qml.BasisState(value, wires=wires))
    assert np.allclose(ours, theirs, atol=1e-12)
    with pytest.raises(qd.QdiffError, match="integer state 4 has no 2-bit form"):
        qd_state(2, lambda: qd.BasisState(4, wires=[0, 1]))


@pytest.mark.parametrize("electrons,orbitals", [(2, 4), (2, 6), (4, 8), (3, 6)])
def test_excitations_and_hf_state_match_qchem(electrons, orbitals):
    assert np.array_equal(qd.hf_state(electrons, orbitals), qml.qchem.hf_state(electrons, orbitals))
    ours = qd.excitations(electrons, orbitals)
    theirs = qml.qchem.excitations(electrons, orbitals)
    assert [list(map(list, x)) for x in ours] == [list(map(list, x)) for x in theirs]


def test_hf_state_and_excitations_check_their_size_and_argument_types(monkeypatch):
    """Lists that grow with the orbitals are checked against the memory budget before they
    are built; counts that are not integers are refused by name."""
    monkeypatch.setenv("QDIFF_MEMORY_LIMIT", "1M")
    with pytest.raises(qd.QdiffMemoryError, match="hf_state of 1000000 orbitals"):
        qd.hf_state(2, 10 ** 6)
    with pytest.raises(qd.QdiffMemoryError, match="excitations of 2 electrons in 200 orbitals"):
        qd.excitations(2, 200)
    for bad in (2.0, True):
        with pytest.raises(qd.QdiffError, match="electrons must be an integer"):
            qd.hf_state(bad, 4)
        with pytest.raises(qd.QdiffError, match="electrons must be an integer"):
            qd.excitations(bad, 4)
    assert qd.hf_state(np.int64(2), 4).tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize("electrons,orbitals", [(2, 4), (2, 6)])
def test_all_singles_doubles(electrons, orbitals):
    singles, doubles = qml.qchem.excitations(electrons, orbitals)
    hf = qml.qchem.hf_state(electrons, orbitals)
    w = rand(len(singles) + len(doubles), seed=7)
    assert qd.AllSinglesDoubles.shape(singles, doubles) == w.shape
    ours = qd_state(orbitals, lambda: qd.AllSinglesDoubles(
        torch.tensor(w), wires=range(orbitals), hf_state=hf, singles=singles, doubles=doubles))
    theirs = pl_state(orbitals, lambda: qml.AllSinglesDoubles(
        w, wires=range(orbitals), hf_state=hf, singles=singles, doubles=doubles))
    assert np.allclose(ours, theirs, atol=1e-12)


def _cost_h(n):
    # PennyLane's cost_layer takes Z-only Hamiltonians
    return ([0.7, -1.2, 0.4, 0.9], [(("Z", 0), ("Z", 1)), (("Z", 1), ("Z", 2)), (("Z", 2),),
                                    (("Z", 0), ("Z", 1), ("Z", 2))])


def _h(lib, coeffs, words):
    ops = []
    for word in words:
        fs = [getattr(lib, {"X": "PauliX", "Y": "PauliY", "Z": "PauliZ"}[l])(w) for l, w in word]
        op = fs[0]
        for f in fs[1:]:
            op = op @ f
        ops.append(op)
    return lib.Hamiltonian(coeffs, ops)


def test_qaoa_cost_and_mixer_layers():
    n = 3
    coeffs, words = _cost_h(n)
    gamma, alpha = 0.37, -0.81
    a, b = prefix(n)

    def ours_body():
        a()
        h = _h(qd, coeffs, words)
        qd.cost_layer(gamma, h)
        qd.mixer_layer(alpha, qd.x_mixer(range(n)))

    def pl_body():
        b()
        h = _h(qml, coeffs, words)
        qml.qaoa.cost_layer(gamma, h)
        qml.qaoa.mixer_layer(alpha, qml.qaoa.x_mixer(range(n)))
    assert np.allclose(qd_state(n, ours_body), pl_state(n, pl_body), atol=1e-12)


def test_qaoa_layers_match_pennylane_layering():
    n = 3
    coeffs, words = _cost_h(n)
    params = rand(2, 2, seed=8)
    assert qd.QAOALayers.shape(2) == params.shape

    def pl_body():
        for w in range(n):
            qml.Hadamard(w)
        h = _h(qml, coeffs, words)

        def layer(g, a):
            qml.qaoa.cost_layer(g, h)
            qml.qaoa.mixer_layer(a, qml.qaoa.x_mixer(range(n)))
        qml.layer(layer, 2, params[:, 0], params[:, 1])
    ours = qd_state(n, lambda: qd.QAOALayers(torch.tensor(params), wires=range(n),
                                             cost_h=_h(qd, coeffs, words)))
    assert np.allclose(ours, pl_state(n, pl_body), atol=1e-12)


def test_hardware_efficient_ansatz_structure():
    """No PennyLane twin: RY, RZ per wire then a CNOT ladder, per layer (checked gate by gate)."""
    w = torch.tensor(rand(2, 3, 2, seed=9))
    t = qd.HardwareEfficientAnsatz(w, wires=[0, 1, 2])
    names = [(op.name, op.wires) for op in t.operations]
    layer = [("ry", (0,)), ("rz", (0,)), ("ry", (1,)), ("rz", (1,)), ("ry", (2,)), ("rz", (2,)),
             ("cx", (0, 1)), ("cx", (1, 2))]
    assert names == layer * 2
    assert qd.HardwareEfficientAnsatz.shape(2, 3) == (2, 3, 2)


def test_fast_recorded_templates_still_reject_bad_wires_and_complex_angles():
    import pytest as _pytest
    from qdiff.circuits.errors import QdiffError
    with _pytest.raises(QdiffError, match="repeated wire"):
        qd.StronglyEntanglingLayers(torch.rand(1, 3, 3), wires=[0, 1, 1])
    with _pytest.raises(QdiffError, match="repeated wire"):
        qd.AngleEmbedding(torch.rand(2), wires=[2, 2])
    with _pytest.raises(QdiffError, match="real"):
        qd.AngleEmbedding(torch.rand(2, dtype=torch.complex128), wires=[0, 1])
    with _pytest.raises(QdiffError, match="real"):
        qd.StronglyEntanglingLayers(torch.rand(1, 2, 3, dtype=torch.complex128), wires=[0, 1])
    ops = qd.StronglyEntanglingLayers(torch.rand(2, 3, 3), wires=["a", "b", "c"]).operations
    assert [(o.name, o.wires) for o in ops[:4]] == [("rot", ("a",)), ("rot", ("b",)),
                                                   ("rot", ("c",)), ("cx", ("a", "b"))]


def test_entangler_layers_refuse_a_rotation_or_entangler_that_is_not_a_gate():
    with pytest.raises(qd.QdiffError, match="rotation"):
        qd_state(2, lambda: qd.BasicEntanglerLayers(torch.zeros(1, 2), wires=[0, 1],
                                                    rotation="Y"))
    with pytest.raises(qd.QdiffError, match="imprimitive"):
        qd_state(2, lambda: qd.StronglyEntanglingLayers(torch.zeros(1, 2, 3), wires=[0, 1],
                                                        imprimitive="CZ"))


@pytest.mark.parametrize("make", [
    lambda **kw: qd.AngleEmbedding(torch.tensor([0.1, 0.2]), wires=range(2), **kw),
    lambda **kw: qd.AmplitudeEmbedding(torch.ones(4) / 2, wires=range(2), **kw),
    lambda **kw: qd.StatePrep(torch.ones(4) / 2, wires=range(2), **kw),
    lambda **kw: qd.BasicEntanglerLayers(torch.ones(1, 2), wires=range(2), **kw),
    lambda **kw: qd.StronglyEntanglingLayers(torch.ones(1, 2, 3), wires=range(2), **kw),
    lambda **kw: qd.BasisState([1, 0], wires=range(2), **kw),
    lambda **kw: qd.AllSinglesDoubles(torch.ones(1), wires=range(4), hf_state=[1, 1, 0, 0],
                                      doubles=[[0, 1, 2, 3]], **kw),
    lambda **kw: qd.QFT(wires=range(2), **kw),
    lambda **kw: qd.IQPEmbedding(torch.tensor([0.1, 0.2]), wires=range(2), **kw),
])
def test_templates_take_pennylanes_id_label_and_refuse_unknown_keywords_by_name(make):
    ours = qd_state(4, lambda: make(id="layer0"))
    assert np.allclose(ours, qd_state(4, lambda: make()), atol=1e-15)
    with pytest.raises(qd.QdiffError, match=r"unknown keyword 'bogus'; valid keywords: .*\bid\b"):
        make(bogus=1)
    with pytest.raises(qd.QdiffError, match="id must be a string"):
        make(id=3)


def test_templates_name_themselves_for_a_missing_or_surplus_argument():
    with pytest.raises(qd.QdiffError, match="AngleEmbedding: missing a required argument"):
        qd.AngleEmbedding(wires=[0])
    with pytest.raises(qd.QdiffError, match="QFT: too many positional arguments"):
        qd.QFT([0, 1], [2])


def test_state_prep_takes_pennylanes_state_and_validate_norm_keywords():
    x = np.random.default_rng(3).normal(size=4)
    x = x / np.linalg.norm(x)
    theirs = pl_state(2, lambda: qml.StatePrep(x, wires=[1, 0], validate_norm=True))
    for kw in (dict(validate_norm=False), dict(validate_norm=True), dict()):
        ours = qd_state(2, lambda: qd.StatePrep(state=torch.tensor(x), wires=[1, 0], **kw))
        assert np.allclose(ours, theirs, atol=1e-12)
        ours = qd_state(2, lambda: qd.AmplitudeEmbedding(torch.tensor(x), wires=[1, 0], **kw))
        assert np.allclose(ours, theirs, atol=1e-12)
    with pytest.raises(qd.QdiffError,
                       match="StatePrep: features must be normalized .*validate_norm"):
        qd_state(2, lambda: qd.StatePrep(torch.ones(4), wires=[0, 1], validate_norm=False))


@pytest.mark.parametrize("ranges,pattern", [
    ([4], r"ranges must not be zero nor divisible by the number of wires \(4\); got 4"),
    ([0], r"ranges must not be zero nor divisible by the number of wires \(4\); got 0"),
    ([1.5], r"ranges must be integers; got 1.5"), ([True], r"ranges must be integers; got True"),
    (2, r"ranges must be a sequence of integers"),
])
def test_strongly_entangling_layers_refuses_ranges_pennylane_refuses(ranges, pattern):
    for imprimitive in (None, qd.CZ):
        with pytest.raises(qd.QdiffError, match="StronglyEntanglingLayers: " + pattern):
            qd_state(4, lambda: qd.StronglyEntanglingLayers(torch.ones(1, 4, 3), wires=range(4),
                                                            ranges=ranges, imprimitive=imprimitive))


def test_strongly_entangling_layers_ranges_wrap_as_pennylanes():
    w = rand(2, 4, 3, seed=8)
    for ranges in ([5, -1], np.array([3, 2]), torch.tensor([1, 6])):
        ours = qd_state(4, lambda: qd.StronglyEntanglingLayers(torch.tensor(w), wires=range(4),
                                                               ranges=ranges))
        theirs = pl_state(4, lambda: qml.StronglyEntanglingLayers(w, wires=range(4),
                                                                 ranges=[int(r) for r in ranges]))
        assert np.allclose(ours, theirs, atol=1e-12)


def test_qchem_helpers_refuse_pennylane_options_they_do_not_implement():
    for d in (1, -1, 2, -2):
        ours = qd.excitations(2, 6, delta_sz=d)
        theirs = qml.qchem.excitations(2, 6, delta_sz=d)
        assert [list(map(list, x)) for x in ours] == [list(map(list, x)) for x in theirs]
    with pytest.raises(qd.QdiffError,
                       match=r"excitations: delta_sz must be 0, \+/-1 or \+/-2; got 3"):
        qd.excitations(2, 4, delta_sz=3)
    with pytest.raises(qd.QdiffError, match="excitations: fermionic=True is not supported"):
        qd.excitations(2, 4, fermionic=True)
    assert qd.excitations(2, 4, fermionic=False) == qml.qchem.excitations(2, 4)
    from qdiff.circuits.templates import hf_state as occupation_hf_state
    with pytest.raises(qd.QdiffError, match="hf_state: basis 'parity' is not supported here"):
        occupation_hf_state(2, 4, basis="parity")
    for basis in ("occupation_number", "parity", "bravyi_kitaev"):  # qd.hf_state: every form
        assert (qd.hf_state(2, 4, basis=basis) == qml.qchem.hf_state(2, 4, basis=basis)).all()
    with pytest.raises(qd.QdiffError, match="hf_state: basis must be one of"):
        qd.hf_state(2, 4, basis="xx")


def test_iqp_embedding_takes_a_numpy_integer_n_repeats():
    x = rand(3, seed=9)
    ours = qd_state(3, lambda: qd.IQPEmbedding(torch.tensor(x), wires=range(3),
                                               n_repeats=np.int64(2)))
    theirs = pl_state(3, lambda: qml.IQPEmbedding(x, wires=range(3), n_repeats=np.int64(2)))
    assert np.allclose(ours, theirs, atol=1e-12)
    with pytest.raises(qd.QdiffError, match="n_repeats must be a positive integer"):
        qd.IQPEmbedding(torch.tensor(x), wires=range(3), n_repeats=np.bool_(True))


def test_complex_numpy_amplitudes_keep_their_imaginary_parts():
    """A complex numpy vector given to StatePrep / AmplitudeEmbedding keeps its complex
    amplitudes (normalize=True normalises the complex vector, not its real part); complex numpy
    angles are refused by name."""
    dev = qd.device("statevector", wires=2)
    for make, kw in ((qd.StatePrep, {}), (qd.AmplitudeEmbedding, {"normalize": True})):
        vec = np.array([1, 1j, 0, 0]) / (np.sqrt(2) if not kw else 1.0)
        out = qd.qnode(dev)(lambda: (make(vec, wires=[0, 1], **kw), qd.expval(qd.Y(1)))[-1])()
        assert float(out) == pytest.approx(1.0, abs=1e-12), make.__name__
    with pytest.raises(qd.QdiffError, match="angles must be real"):
        qd.qnode(dev)(lambda: (qd.AngleEmbedding(np.array([0.1 + 0.1j, 0.2]), wires=[0, 1]),
                               qd.expval(qd.Z(0)))[-1])()
