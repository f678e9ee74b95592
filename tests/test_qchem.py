"""Molecular Hamiltonians from PennyLane qchem: conversion, expectations vs PennyLane and dense."""
import re

import numpy as np
import pytest
import torch

import qdiff as qd
from qdiff import qchem
from qdiff.operators import PauliSumOperator
from qdiff.solvers import lanczos

pytestmark = pytest.mark.filterwarnings("ignore")


def random_state(n, seed):
    g = torch.Generator().manual_seed(seed)
    psi = torch.randn(2 ** n, generator=g, dtype=torch.float64) + \
        1j * torch.randn(2 ** n, generator=g, dtype=torch.float64)
    return psi / psi.norm()


def pennylane_expval(H_pl, n, psi):
    import pennylane as qml
    dev = qml.device("default.qubit", wires=n)

    @qml.qnode(dev)
    def circ():
        qml.StatePrep(psi.numpy(), wires=range(n))
        return qml.expval(H_pl)
    return float(circ())


def check_molecule(name, dense: bool):
    import pennylane as qml
    mol = qchem.molecule(name)
    n = mol.n_qubits
    H_pl = qchem.to_pennylane(mol.hamiltonian)
    op = PauliSumOperator.from_observable(mol.hamiltonian, n)
    psi = random_state(n, 7)
    ours = float(op.expval(psi))
    assert abs(ours - pennylane_expval(H_pl, n, psi)) < 1e-10
    S = H_pl.sparse_matrix(wire_order=range(n))  # PennyLane's own matrix
    ref = complex(psi.numpy().conj() @ (S @ psi.numpy())).real
    assert abs(ours - ref) < 1e-10
    if dense:
        M = op.to_dense()
        assert abs(float((psi.conj() @ M @ psi).real) - ours) < 1e-10
    return mol, op


def test_h2_matches_pennylane_and_dense():
    mol, op = check_molecule("H2", dense=True)
    assert mol.n_qubits == 4 and mol.electrons == 2 and len(mol.hamiltonian.terms) == 15
    # FCI energy of H2/STO-3G at 0.7414 A (a published value: -1.13727 Ha)
    e, _, _ = lanczos(op, 1, mask=mol.sector_mask())
    assert abs(float(e[0]) + 1.137270) < 1e-5
    hf = torch.zeros(16, dtype=torch.float64)
    hf[mol.hf_index] = 1
    assert mol.hf_index == 0b1100
    assert float(op.expval(hf)) > float(e[0]) + 0.01  # HF misses correlation


@pytest.mark.slow
def test_lih_10_qubits_matches_pennylane_and_dense():
    mol, op = check_molecule("LiH", dense=True)
    assert mol.n_qubits == 10 and mol.electrons == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["BeH2", "LiH-12"])
def test_12_qubit_molecules_match_pennylane(name):
    mol, _ = check_molecule(name, dense=False)
    assert mol.n_qubits == 12


def test_conversion_roundtrip_and_wire_order():
    import pennylane as qml
    H = qml.dot([0.5, -0.2, 0.3], [qml.PauliZ("a") @ qml.PauliX("b"), qml.PauliY("b"),
                                   qml.Identity("a")])
    obs = qchem.from_pennylane(H, wire_order=["a", "b"])
    assert torch.allclose(obs.matrix(wire_order=[0, 1]),
                          torch.tensor(qml.matrix(H, wire_order=["a", "b"])), atol=1e-14)
    with pytest.raises(qd.QdiffError, match="not in wire_order"):
        qchem.from_pennylane(H, wire_order=["a"])
    with pytest.raises(qd.QdiffError, match="complex coefficient"):
        qchem.from_pennylane(qml.s_prod(1j, qml.PauliZ(0)))


def test_bad_input_and_units():
    with pytest.raises(qd.QdiffError, match="unknown molecule"):
        qchem.molecule("XeF6")
    with pytest.raises(qd.QdiffError, match="unknown molecule"):
        qchem.molecule(["H2"])
    with pytest.raises(qd.QdiffError, match="Observable"):
        qchem.to_pennylane("Z0")
    with pytest.raises(qd.QdiffError, match="6 coordinates"):
        qchem.molecular_hamiltonian(["H", "H"], [0.0, 0.0, 0.7])
    with pytest.raises(qd.QdiffError, match="unit"):
        qchem.molecular_hamiltonian(["H", "H"], [0, 0, 0, 0, 0, 0.74], unit="pm")
    for coords in (np.array([0, 0, 0, 0, 0, 0.74 + 0.1j]), np.array([0, 0, 0, 0, 0, 0.74 + 0j]),
                   torch.tensor([0, 0, 0, 0, 0, 0.74 + 0.1j])):  # never cut to the real part
        with pytest.raises(qd.QdiffError, match="coordinates must be numbers; got complex"):
            qchem.molecular_hamiltonian(["H", "H"], coords, unit="angstrom")
    with pytest.raises(qd.QdiffError, match=r"unknown keyword\(s\) \['units'\]"):
        qchem.molecular_hamiltonian(["H", "H"], [0, 0, 0, 0, 0, 0.74], units="angstrom")
    # bohr vs angstrom: the same geometry in the two units gives the same Hamiltonian
    a, na = qchem.molecular_hamiltonian(["H", "H"], [0, 0, 0, 0, 0, 0.7414], unit="angstrom")
    b, nb = qchem.molecular_hamiltonian(["H", "H"], [0, 0, 0, 0, 0, 0.7414 / 0.529177210903])
    assert na == nb == 4
    ma, mb = a.matrix(wire_order=range(4)), b.matrix(wire_order=range(4))
    assert torch.allclose(ma, mb, atol=1e-6)


def test_molecular_hamiltonian_matches_pennylane_defaults():
    """PennyLane's unit default (bohr) and return convention (H, qubits): the H2 demo's
    coordinates give PennyLane's Hamiltonian, whose ground energy is -1.1362 Ha."""
    import pennylane as qml
    symbols, coords = ["H", "H"], np.array([0.0, 0.0, -0.6614, 0.0, 0.0, 0.6614])
    H, qubits = qchem.molecular_hamiltonian(symbols, coords)
    H_pl, q_pl = qml.qchem.molecular_hamiltonian(symbols, coords)
    assert qubits == q_pl == 4
    ref = torch.tensor(qml.matrix(H_pl, wire_order=range(4)))
    assert torch.allclose(H.matrix(wire_order=range(4)), ref, atol=1e-10)
    assert float(torch.linalg.eigvalsh(ref)[0]) == pytest.approx(-1.13619, abs=1e-4)
    assert np.array_equal(qchem.hf_state(2, 4), qml.qchem.hf_state(2, 4))
    assert np.array_equal(qd.qchem.hf_state(4, 12), qml.qchem.hf_state(4, 12))


def test_molecular_hamiltonian_of_a_pennylane_molecule():
    """PennyLane's Molecule form: the molecule's coordinates (angstrom converted to bohr by
    Molecule), charge and basis set give PennyLane's Hamiltonian; what the Molecule carries
    given again, and basis parameters of its own, are refused."""
    import pennylane as qml
    mol = qml.qchem.Molecule(["H", "H", "H"], np.array([[0, 0, 0], [0, 0, 0.74], [0, 0.74, 0]]),
                             charge=1, unit="angstrom")
    H, qubits = qchem.molecular_hamiltonian(mol, active_electrons=2, active_orbitals=2)
    H_pl, q_pl = qml.qchem.molecular_hamiltonian(mol, active_electrons=2, active_orbitals=2)
    assert qubits == q_pl == 4
    ref = torch.tensor(qml.matrix(H_pl, wire_order=range(4)))
    assert torch.allclose(H.matrix(wire_order=range(4)), ref, atol=1e-10)
    with pytest.raises(qd.QdiffError, match="charge"):
        qchem.molecular_hamiltonian(mol, charge=0)
    with pytest.raises(qd.QdiffError, match="coordinates"):
        qchem.molecular_hamiltonian(mol, [0, 0, 0, 0, 0, 1, 0, 1, 0])
    with pytest.raises(qd.QdiffError, match="coordinates"):
        qchem.molecular_hamiltonian(["H", "H"])
    own = qml.qchem.Molecule(["H", "H"], np.array([[0, 0, 0], [0, 0, 1.4]]),
                             alpha=[np.array([3.4, 0.6, 0.17])] * 2)
    with pytest.raises(qd.QdiffError, match="alpha"):
        qchem.molecular_hamiltonian(own)


def test_particle_number_mask():
    m = qchem.particle_number_mask(4, 2)
    assert int(m.sum()) == 6 and bool(m[0b1100]) and not bool(m[0b1110])
    assert np.array_equal(qchem.molecule("H2").hf_state, [1, 1, 0, 0])


def test_pennylane_refusals_are_qdiff_errors_and_unit_case_follows_pennylane():
    import pennylane as qml
    sym, co = ["H", "H"], [0.0, 0.0, -0.6614, 0.0, 0.0, 0.6614]
    for bad, what in ((dict(mult=3), "mult=3"), (dict(mapping="xyz"), "mapping='xyz'"),
                      (dict(active_electrons=3, active_orbitals=1), "active_electrons=3")):
        with pytest.raises(qd.QdiffError, match=re.escape(what)):
            qchem.molecular_hamiltonian(sym, co, **bad)
    with pytest.raises(qd.QdiffError, match="Xx"):
        qchem.molecular_hamiltonian(["Xx", "H"], co)
    with pytest.raises(qd.QdiffError, match="require grad"):
        qchem.molecular_hamiltonian(sym, torch.tensor(co, requires_grad=True))
    H, n = qchem.molecular_hamiltonian(sym, co, unit="Bohr")  # PennyLane accepts any case
    H_pl, n_pl = qml.qchem.molecular_hamiltonian(sym, np.array(co), unit="Bohr")
    assert n == n_pl == 4
    assert torch.allclose(H.matrix(wire_order=range(4)),
                          torch.tensor(qml.matrix(H_pl, wire_order=range(4))), atol=1e-10)


@pytest.mark.parametrize("mapping", ["parity", "bravyi_kitaev", "Parity"])
def test_hf_state_follows_the_mapping(mapping):
    """Under parity / Bravyi-Kitaev the HF qubit state is PennyLane's ``hf_state(...,
    basis=mapping)`` and its energy is the HF energy of the Jordan-Wigner Hamiltonian; the
    occupation-count sector mask is refused there (it is the particle number only under JW)."""
    import pennylane as qml
    key = mapping.lower()
    jw = qchem.molecule("H2")
    mol = qchem.molecule("H2", mapping=mapping)
    assert np.array_equal(mol.hf_state, qml.qchem.hf_state(2, 4, basis=key))
    assert np.array_equal(qchem.hf_state(2, 4, basis=key), qml.qchem.hf_state(2, 4, basis=key))
    m = mol.hamiltonian.matrix(list(range(4)))
    e_hf = float(m[mol.hf_index, mol.hf_index].real)
    e_hf_jw = float(jw.hamiltonian.matrix(list(range(4)))[jw.hf_index, jw.hf_index].real)
    assert abs(e_hf - e_hf_jw) < 1e-10
    with pytest.raises(qd.QdiffError, match="jordan_wigner"):
        mol.sector_mask()
    with pytest.raises(qd.QdiffError, match="basis"):
        qchem.hf_state(2, 4, basis="bogus")


def test_molecule_overrides_and_missing_backends_are_qdiff_errors():
    with pytest.raises(qd.QdiffError, match="units"):
        qchem.molecule("H2", units="bohr")
    with pytest.raises(qd.QdiffError, match="without coordinates"):
        qchem.molecule("H2", unit="bohr")  # the preset's angstrom read as bohr
    with pytest.raises(qd.QdiffError, match="charge must be an integer"):
        qchem.molecule("H2", charge=0.5)
    try:
        import pyscf  # noqa: F401
    except ImportError:
        with pytest.raises(qd.QdiffError, match="method='pyscf'"):
            qchem.molecular_hamiltonian(["H", "H"], [0, 0, 0, 0, 0, 1.4], method="pyscf")


def test_from_pennylane_keeps_integer_wire_labels_and_refuses_non_pauli_operators():
    """Without wire_order, PennyLane's integer wires are qdiff's wires (Z(2) measures wire 2,
    as qml.expval(H) does), and an operator that is no Pauli sum is a QdiffError."""
    import pennylane as qml
    H = qml.PauliZ(2) + 0.5 * qml.PauliX(3) @ qml.PauliY(5)
    obs = qchem.from_pennylane(H)
    assert sorted(map(lambda w: sorted(w.items()), obs.pauli_words())) == \
        [[(2, "Z")], [(3, "X"), (5, "Y")]]
    ref = torch.tensor(qml.matrix(H, wire_order=range(6)))
    assert torch.allclose(obs.matrix(wire_order=list(range(6))), ref, atol=1e-14)
    for bad in (qml.Hadamard(0), qml.RX(0.3, wires=0), "Z0", 3.0):
        with pytest.raises(qd.QdiffError, match="Pauli"):
            qchem.from_pennylane(bad)


def test_molecule_inputs_are_checked_before_pennylane():
    """Non-finite or coincident coordinates, symbols that are not a list of symbols, and
    basis / mapping / method that are not strings are QdiffErrors naming the input
    (PennyLane returns 0 * I for an infinite coordinate); so is a charge that leaves fewer than
    zero electrons, or more than the spin orbitals hold (PennyLane builds a Hamiltonian there,
    whose HF state would not fit the qubits)."""
    sym = ["H", "H"]
    for co, what in (([0, 0, 0, 0, 0, float("inf")], "finite"),
                     ([0, 0, 0, 0, 0, float("nan")], "finite"),
                     ([0, 0, 0.5, 0, 0, 0.5], "coincident")):
        with pytest.raises(qd.QdiffError, match=what):
            qchem.molecular_hamiltonian(sym, co)
    for symbols in ("HH", [], None, ["H", 1]):
        with pytest.raises(qd.QdiffError, match="symbols"):
            qchem.molecular_hamiltonian(symbols, [0, 0, 0, 0, 0, 1.4])
    for kw in (dict(basis=None), dict(mapping=None), dict(mapping=3), dict(method=None)):
        with pytest.raises(qd.QdiffError, match=f"{next(iter(kw))} must be a string"):
            qchem.molecular_hamiltonian(sym, [0, 0, 0, 0, 0, 1.4], **kw)
    qchem.molecular_hamiltonian(sym, [0, 0, 0, 0, 0, 1.4], active_electrons=2)  # now cached
    for v in (2.0, True, "2"):  # refused whatever the cache holds
        with pytest.raises(qd.QdiffError, match="active_electrons must be an integer"):
            qchem.molecular_hamiltonian(sym, [0, 0, 0, 0, 0, 1.4], active_electrons=v)
    with pytest.raises(qd.QdiffError, match="active_orbitals must be an integer"):
        qchem.molecular_hamiltonian(sym, [0, 0, 0, 0, 0, 1.4], active_orbitals=2.0)
    for charge, what in ((-4, "6 electrons"), (4, "-2 electrons")):  # 4 spin orbitals in H2
        with pytest.raises(qd.QdiffError, match=what):
            qchem.molecule("H2", charge=charge)
    H, n = qchem.molecular_hamiltonian(np.array(sym), [0, 0, 0, 0, 0, 1.4])  # an array of names
    assert n == 4 and len(H.terms) == 15


def test_nearly_coincident_atoms_are_refused_as_linearly_dependent_basis():
    """Atoms so close that their basis functions are linearly dependent: PennyLane's
    Hartree-Fock returns the nuclear repulsion alone at 1e-6 bohr (the electrons' -2.6 Ha
    gone) and an energy 40 Ha too low at 1e-4 bohr; both are refused, naming the atoms. At
    1e-3 bohr the electronic energy is that of the united atom limit."""
    for d in (1e-6, 1e-4):
        with pytest.raises(qd.QdiffError, match=r"linearly dependent.*atoms, 0 \('H'\) and 1"):
            qchem.molecular_hamiltonian(["H", "H"], [0, 0, 0, 0, 0, d])
    H, n = qchem.molecular_hamiltonian(["H", "H"], [0, 0, 0, 0, 0, 1e-3])
    e = float(torch.linalg.eigvalsh(H.matrix(wire_order=range(n)))[0])
    assert e - 1e3 == pytest.approx(-2.6175, abs=1e-3)


def test_text_coordinates_and_multiplicity_below_one_are_refused():
    """Coordinates given as text are not read as numbers, and a multiplicity below 1 is named
    as such (PennyLane calls it an open-shell system)."""
    for co in (["0"] * 5 + ["1.4"], np.array(["0"] * 5 + ["1.4"])):
        with pytest.raises(qd.QdiffError, match="coordinates must be numbers; got text"):
            qchem.molecular_hamiltonian(["H", "H"], co)
    for mult in (0, -1):
        with pytest.raises(qd.QdiffError, match=rf"multiplicity 2S \+ 1, at least 1; got {mult}"):
            qchem.molecular_hamiltonian(["H", "H"], [0, 0, 0, 0, 0, 1.4], mult=mult)


def test_unconverged_hartree_fock_is_refused():
    """PennyLane's SCF (plain iterations, 50 steps) does not converge for LiH at 4 angstrom: the
    determinant it calls Hartree-Fock lies 330 mHa above the self-consistent one and an
    active space would be chosen from those orbitals. Its occupied-virtual Fock elements
    (Brillouin's theorem) are 0.08 Ha there, and the molecule is refused; H4 at 2 angstrom,
    where the SCF converges slowly (1e-5 Ha left), is kept."""
    for active in ({}, dict(active_electrons=2, active_orbitals=3)):
        with pytest.raises(qd.QdiffError, match=r"\['Li', 'H'\] at .*4\.0\] angstrom: "
                                                r"PennyLane's Hartree-Fock .* did not converge"):
            qchem.molecular_problem(["Li", "H"], [0, 0, 0, 0, 0, 4.0], unit="angstrom",
                                    **active)
    mol = qchem.molecular_problem(["H"] * 4, [0, 0, 0, 0, 0, 2, 0, 0, 4, 0, 0, 6],
                                  unit="angstrom")
    op = PauliSumOperator.from_observable(mol.hamiltonian, mol.n_qubits)
    psi = torch.zeros(2 ** mol.n_qubits, dtype=torch.float64)
    psi[mol.hf_index] = 1.0
    hf_e = float(op.expval(psi))
    e0 = float(torch.linalg.eigvalsh(mol.hamiltonian.matrix(range(8)))[0])
    assert hf_e - e0 > 0.1  # stretched: far from exact, but a Hartree-Fock energy


def test_multiplicity_impossible_for_the_electron_count_is_named():
    """An odd electron count with multiplicity 1 (or an even one with 2, or more unpaired
    electrons than electrons) has no state at all; PennyLane calls it an unsupported open-shell
    system and points to another method."""
    h3 = [0, 0, 0, 0.874, 0, 0, 0.437, 0.757, 0]
    for sym, co, kw, n_el in ((["H"] * 3, h3, dict(mult=1), 3),
                              (["H", "H"], [0, 0, 0, 0, 0, 0.74], dict(mult=2), 2),
                              (["H", "H"], [0, 0, 0, 0, 0, 0.74], dict(mult=5), 2),
                              (["H"] * 3, h3, dict(charge=1, mult=2), 2)):
        with pytest.raises(qd.QdiffError, match=rf"{n_el} electrons \(charge=.*\) cannot have "
                                                rf"multiplicity mult={kw['mult']}"):
            qchem.molecular_problem(sym, co, unit="angstrom", **kw)
    with pytest.raises(qd.QdiffError, match="Open-shell"):  # possible, but not by method='dhf'
        qchem.molecular_problem(["H", "H"], [0, 0, 0, 0, 0, 0.74], unit="angstrom", mult=3)
