"""Molecular Hamiltonians from PennyLane's qchem (offline, differentiable Hartree-Fock), as qdiff
observables.

PennyLane builds the second-quantized Hamiltonian with its own Hartree-Fock solver (no PySCF,
no network) and maps it to qubits (Jordan-Wigner by default); this module converts the
resulting operator, through its ``pauli_rep``, into a :class:`qdiff.Observable` on wires
``0..n-1`` and returns it with the facts a VQE needs (qubits, active electrons, HF state).

:func:`molecular_hamiltonian` follows PennyLane's ``qml.qchem.molecular_hamiltonian``: coordinates
in bohr unless ``unit="angstrom"``, and it returns ``(H, qubits)``. :func:`molecular_problem`
returns the same Hamiltonian with the facts a VQE needs (:class:`MolecularProblem`); the presets
of :func:`molecule` are in angstrom.

>>> from qdiff import qchem
>>> H, qubits = qchem.molecular_hamiltonian(["H", "H"], [0, 0, -0.6614, 0, 0, 0.6614])  # doctest: +SKIP
>>> qubits, len(H.terms)                                                                 # doctest: +SKIP
(4, 15)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

from qdiff.circuits import caches, memory
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.observables import Factor, Observable

# Geometries (angstrom) and active spaces used by the VQE examples. Each active space is one
# whose Hartree-Fock energy misses the exact (FCI-in-active-space) energy by well over chemical
# accuracy, so that reaching 1.6 mHa is a real test.
PRESETS = {
    "H2": dict(symbols=("H", "H"), coordinates=(0.0, 0.0, 0.0, 0.0, 0.0, 0.7414)),
    "LiH": dict(symbols=("Li", "H"), coordinates=(0.0, 0.0, 0.0, 0.0, 0.0, 1.5949),
                active_electrons=2, active_orbitals=5),
    "LiH-12": dict(symbols=("Li", "H"), coordinates=(0.0, 0.0, 0.0, 0.0, 0.0, 1.5949)),
    "BeH2": dict(symbols=("H", "Be", "H"),
                 coordinates=(0.0, 0.0, -1.3264, 0.0, 0.0, 0.0, 0.0, 0.0, 1.3264),
                 active_electrons=4, active_orbitals=6),
}


@dataclass
class MolecularProblem:
    """A qubit Hamiltonian and what a VQE needs to know about it."""

    hamiltonian: Observable
    n_qubits: int
    electrons: int  # active electrons
    symbols: tuple
    coordinates: tuple  # flat, in ``unit``
    unit: str = "angstrom"
    extra: dict = field(default_factory=dict)

    @property
    def mapping(self) -> str:
        return self.extra.get("mapping", "jordan_wigner")

    @property
    def hf_state(self) -> np.ndarray:
        """Qubit bits of the Hartree-Fock state in the Hamiltonian's mapping: ``electrons`` ones
        then zeros under Jordan-Wigner, as ``qml.qchem.hf_state(..., basis=...)`` otherwise."""
        occupied = np.array([1] * self.electrons + [0] * (self.n_qubits - self.electrons))
        if self.mapping == "jordan_wigner" or self.electrons == 0:
            return occupied
        return hf_state(self.electrons, self.n_qubits, basis=self.mapping)

    @property
    def hf_index(self) -> int:
        """Basis-state index of the HF state (wire 0 = most significant bit)."""
        return int("".join(str(b) for b in self.hf_state), 2)

    def sector_mask(self) -> torch.Tensor:
        """Basis states with the active particle number (for a ground state in that sector);
        Jordan-Wigner only, where a qubit is a spin orbital's occupation."""
        if self.mapping != "jordan_wigner":
            raise QdiffError(f"sector_mask: the particle-number mask counts occupied qubits, "
                             f"which is the particle number under mapping='jordan_wigner' "
                             f"only; this Hamiltonian uses mapping={self.mapping!r}")
        return particle_number_mask(self.n_qubits, self.electrons)


def from_pennylane(op, wire_order: Optional[Sequence] = None) -> Observable:
    """Convert a PennyLane operator (anything with a ``pauli_rep``) to a :class:`qdiff.Observable`.

    Wires are mapped to their position in ``wire_order``. Without it, integer wires keep their
    labels (PennyLane's wire 2 is qdiff's wire 2, as in ``qml.expval(H)``) and other labels
    take their position in ``op.wires``. Coefficients with an imaginary part above 1e-12 are
    refused (not Hermitian).
    """
    import pennylane as qml
    try:
        ps = op.pauli_rep if getattr(op, "pauli_rep", None) is not None else \
            qml.pauli.pauli_sentence(op)
    except (ValueError, TypeError, AttributeError) as e:
        raise QdiffError(f"from_pennylane: {op!r} is not a linear combination of Pauli "
                         f"operators ({type(e).__name__}: {e})") from None
    if wire_order is None:
        ws = list(op.wires)
        ints = all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) and w >= 0
                   for w in ws)
        pos = {w: int(w) for w in ws} if ints else {w: i for i, w in enumerate(ws)}
    else:
        pos = {w: i for i, w in enumerate(wire_order)}
    coeffs, terms = [], []
    for word, c in ps.items():
        c = complex(qml.math.toarray(c))
        if abs(c.imag) > 1e-12:
            raise QdiffError(f"PennyLane operator has a complex coefficient {c} on {word}; "
                             "a Hermitian Pauli sum needs real coefficients")
        try:
            factors = tuple(Factor((pos[w],), l) for w, l in sorted(word.items(), key=lambda x: pos[x[0]])
                            if l != "I")
        except KeyError as e:
            raise QdiffError(f"PennyLane operator acts on wire {e.args[0]!r}, not in wire_order "
                             f"{list(wire_order)}") from None
        coeffs.append(c.real)
        terms.append(factors)
    return Observable(torch.tensor(coeffs, dtype=torch.float64), terms)


def to_pennylane(obs: Observable):
    """The PennyLane operator of a Pauli-sum :class:`qdiff.Observable` (wires as integers)."""
    import pennylane as qml
    if not isinstance(obs, Observable):
        raise QdiffError(f"to_pennylane: expected a qdiff Observable; got {type(obs).__name__}")
    ops = []
    for word in obs.pauli_words():
        p = [getattr(qml, "Pauli" + l)(w) for w, l in sorted(word.items())]
        ops.append(qml.prod(*p) if len(p) > 1 else (p[0] if p else qml.Identity(0)))
    return qml.dot([float(c) for c in obs.real_coeffs().detach().cpu()], ops)


def particle_number_mask(n_qubits: int, electrons: int) -> torch.Tensor:
    """``(2**n,)`` bool: basis states with exactly ``electrons`` ones."""
    for name, v in (("n_qubits", n_qubits), ("electrons", electrons)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise QdiffError(f"particle_number_mask: {name} must be a non-negative integer; "
                             f"got {v!r}")
    memory.require(17.0 * 2.0 ** n_qubits, f"particle_number_mask: a mask over the "
                   f"2**{n_qubits} basis states")
    idx = torch.arange(1 << n_qubits)
    ones = torch.zeros_like(idx)
    for b in range(n_qubits):
        ones += (idx >> b) & 1
    return ones == electrons


@caches.cached(maxsize=16)
def _cached(symbols, coordinates, unit, charge, mult, basis, active_electrons, active_orbitals,
            mapping, method):
    import pennylane as qml
    geom = np.array(coordinates, dtype=float).reshape(-1, 3)
    mol = qml.qchem.Molecule(list(symbols), geom, charge=charge, mult=mult, basis_name=basis,
                             unit=unit)
    _check_basis_independent(mol, symbols, basis)
    n_el = int(mol.n_electrons)
    if n_el >= 0 and (mult - 1 > n_el or (n_el - mult + 1) % 2):
        raise QdiffError(f"molecular Hamiltonian of {list(symbols)}: {n_el} electrons "
                         f"(charge={charge}) cannot have multiplicity mult={mult}; 2S = mult - 1 "
                         f"unpaired electrons need at least as many electrons, of the same "
                         f"parity")
    op, n = qml.qchem.molecular_hamiltonian(mol, active_electrons=active_electrons,
                                            active_orbitals=active_orbitals, mapping=mapping,
                                            method=method)
    obs = from_pennylane(op, wire_order=list(range(n)))
    if method == "dhf":
        coupling = _scf_residual(mol)
        if coupling > _BRILLOUIN_TOL:
            raise QdiffError(
                f"molecular Hamiltonian of {list(symbols)} at {list(coordinates)} {unit}: "
                f"PennyLane's Hartree-Fock (method='dhf', plain SCF iterations) did not "
                f"converge there; its orbitals leave an occupied-virtual Fock element of "
                f"{coupling:.2g} Ha (0 for Hartree-Fock orbitals by Brillouin's theorem, "
                f"accepted up to {_BRILLOUIN_TOL:g}), so the Hartree-Fock state and energy of "
                f"its Hamiltonian, and any active space chosen from its orbitals, are not "
                f"Hartree-Fock's")
    return obs.coeffs.detach().clone(), obs.terms, int(n), int(mol.n_electrons)


# Largest occupied-virtual Fock element (in Ha) that counts as converged Hartree-Fock orbitals;
# it is the coupling <S|H|HF> of the HF state to a single excitation, and the HF energy error
# of such orbitals is about its square over the orbital gap. PennyLane's SCF leaves about 1e-9
# on the presets and 1e-5 where it converges slowly (H4 chain at 2 angstrom); where it does not
# converge (LiH at 4 angstrom, stretched H2O, N2 at 2 angstrom) it leaves 0.08-0.3 Ha.
_BRILLOUIN_TOL = 1e-4


def _scf_residual(mol) -> float:
    """Largest ``|F_ia|`` (occupied ``i``, virtual ``a``) of the Fock matrix built from the
    orbitals of PennyLane's SCF, in their own basis: 0 for self-consistent (Hartree-Fock)
    orbitals. PennyLane's SCF is deterministic, so these are the orbitals of its Hamiltonian."""
    import pennylane as qml
    _, coeffs, _, h_core, eri = qml.qchem.scf(mol)()
    c = np.asarray(qml.math.toarray(coeffs), dtype=float)
    occ = int(mol.n_electrons) // 2
    if occ == 0 or occ >= c.shape[1]:
        return 0.0
    eri = np.asarray(qml.math.toarray(eri), dtype=float)
    p = c[:, :occ] @ c[:, :occ].T
    fock = (np.asarray(qml.math.toarray(h_core), dtype=float)
            + 2 * np.einsum("pqrs,rs->pq", eri, p) - np.einsum("psqr,rs->pq", eri, p))
    return float(np.abs(c[:, :occ].T @ fock @ c[:, occ:]).max())


# Smallest eigenvalue of the basis overlap matrix below which the basis counts as linearly
# dependent. Molecules in PennyLane's basis sets (sto-3g to cc-pvdz) stay above 1e-3; H2 at
# 3e-4 bohr (2e-8) already comes out 1.4 mHa off, and at 1e-4 bohr (2e-9) 40 Ha off.
_OVERLAP_FLOOR = 1e-7


def _check_basis_independent(mol, symbols, basis) -> None:
    """Refuse a geometry whose basis functions are (numerically) linearly dependent: atoms so
    close that their orbitals nearly coincide. PennyLane's Hartree-Fock orthogonalizes with
    the overlap matrix's inverse square root and there returns a meaningless Hamiltonian
    (for nearly coincident H atoms: one term, the nuclear repulsion)."""
    import pennylane as qml
    s = np.asarray(qml.math.toarray(qml.qchem.overlap_matrix(mol.basis_set)()), dtype=float)
    s_min = float(np.linalg.eigvalsh(s)[0])
    if s_min >= _OVERLAP_FLOOR:
        return
    xyz = np.asarray(qml.math.toarray(mol.coordinates), dtype=float).reshape(-1, 3)  # bohr
    pairs = [(float(np.linalg.norm(xyz[i] - xyz[j])), i, j)
             for i in range(len(xyz)) for j in range(i + 1, len(xyz))]
    where = ""
    if pairs:
        d, i, j = min(pairs)
        where = (f"; the closest atoms, {i} ({symbols[i]!r}) and {j} ({symbols[j]!r}), are "
                 f"{d:.3g} bohr ({d * 0.529177210903:.3g} angstrom) apart")
    raise QdiffError(f"molecular Hamiltonian of {list(symbols)}: the {basis} basis functions "
                     f"are linearly dependent (smallest overlap eigenvalue {s_min:.2g}, below "
                     f"{_OVERLAP_FLOOR:g}){where}; Hartree-Fock has no meaningful solution "
                     "there")


_OPTIONS = ("unit", "charge", "mult", "basis", "active_electrons", "active_orbitals",
            "mapping", "method")


def molecular_hamiltonian(symbols, coordinates=None, **options) -> tuple:
    """``(H, qubits)``: the qubit Hamiltonian of a molecule as a :class:`qdiff.Observable` on
    wires ``0..qubits-1`` and its number of qubits, as PennyLane's
    ``qml.qchem.molecular_hamiltonian`` returns them (coordinates in bohr by default).

    Called as PennyLane is: with ``symbols`` and ``coordinates``, or with a
    ``qml.qchem.Molecule`` (its symbols, coordinates, charge, multiplicity and basis set).
    Keyword options (PennyLane's names and defaults): ``unit="bohr"`` (or ``"angstrom"``),
    ``charge=0``, ``mult=1``, ``basis="sto-3g"`` (these four only with symbols), ``method="dhf"``,
    ``active_electrons``, ``active_orbitals`` (None: all), ``mapping="jordan_wigner"``; any
    other keyword is refused.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise QdiffError(f"molecular_hamiltonian: unknown keyword(s) {unknown}; valid: "
                         f"{list(_OPTIONS)}")
    if _is_molecule(symbols):
        symbols, coordinates, options = _molecule_arguments(symbols, coordinates, options)
    elif coordinates is None:
        raise QdiffError("molecular_hamiltonian: give symbols and coordinates, or a "
                         "qml.qchem.Molecule")
    options.setdefault("unit", "bohr")
    prob = molecular_problem(symbols, coordinates, **options)
    return prob.hamiltonian, prob.n_qubits


def _is_molecule(obj) -> bool:
    return type(obj).__name__ == "Molecule" and hasattr(obj, "basis_name") and \
        hasattr(obj, "symbols")


def _molecule_arguments(mol, coordinates, options) -> tuple:
    """``(symbols, coordinates in bohr, options)`` of a ``qml.qchem.Molecule``; a Molecule with
    basis parameters of its own (not those of its basis set) is refused, as only the basis
    set's name reaches the Hamiltonian."""
    import pennylane as qml
    if coordinates is not None:
        raise QdiffError("molecular_hamiltonian: a Molecule carries its coordinates; got "
                         "coordinates as well")
    given = sorted(set(options) & {"unit", "charge", "mult", "basis"})
    if given:
        raise QdiffError(f"molecular_hamiltonian: {given} are set on the Molecule; give them "
                         "to qml.qchem.Molecule")
    coords = np.asarray(mol.coordinates, dtype=float)
    fresh = qml.qchem.Molecule(list(mol.symbols), coords, charge=mol.charge, mult=mol.mult,
                               basis_name=mol.basis_name, unit="bohr")
    for name in ("l", "alpha", "coeff", "r"):
        mine, ref = getattr(mol, name, None), getattr(fresh, name, None)
        same = mine is not None and ref is not None and len(mine) == len(ref) and all(
            np.shape(a) == np.shape(b) and np.allclose(np.asarray(a, dtype=float),
                                                       np.asarray(b, dtype=float))
            for a, b in zip(mine, ref))
        if not same:
            raise QdiffError(f"molecular_hamiltonian: the Molecule's basis parameter {name!r} "
                             f"differs from basis set {mol.basis_name!r}'s; only a basis set "
                             "by name is supported")
    opts = dict(options, unit="bohr", charge=int(mol.charge), mult=int(mol.mult),
                basis=mol.basis_name)
    return list(mol.symbols), coords, opts


_HF_BASES = {"occupation_number": "occupation_number", "jordan_wigner": "occupation_number",
             "parity": "parity", "bravyi_kitaev": "bravyi_kitaev"}


def hf_state(electrons: int, orbitals: int, basis: str = "occupation_number") -> np.ndarray:
    """Qubit bits of the Hartree-Fock state, as ``qml.qchem.hf_state``: ``basis`` is
    ``"occupation_number"`` (Jordan-Wigner; the default), ``"parity"`` or ``"bravyi_kitaev"``
    (a mapping's name is accepted for its basis)."""
    from qdiff.circuits.templates import hf_state as _hf
    occupied = _hf(electrons, orbitals)
    key = basis.strip().lower() if isinstance(basis, str) else basis
    if key not in _HF_BASES:
        raise QdiffError(f"hf_state: basis must be one of {sorted(_HF_BASES)}; got {basis!r}")
    if _HF_BASES[key] == "occupation_number":
        return occupied
    import pennylane as qml
    return np.asarray(qml.qchem.hf_state(electrons, orbitals, basis=_HF_BASES[key]), dtype=int)


def molecular_problem(symbols: Sequence[str], coordinates, *, unit: str,
                      charge: int = 0, mult: int = 1, basis: str = "sto-3g",
                      active_electrons: Optional[int] = None,
                      active_orbitals: Optional[int] = None, mapping: str = "jordan_wigner",
                      method: str = "dhf") -> MolecularProblem:
    """Qubit Hamiltonian of a molecule via ``qml.qchem.molecular_hamiltonian`` (cached in memory),
    with what a VQE needs to know (qubits, active electrons, HF state).

    Args:
        symbols: atomic symbols, e.g. ``["Li", "H"]``.
        coordinates: ``(3 * atoms,)`` or ``(atoms, 3)`` positions in ``unit``.
        unit: ``"angstrom"`` or ``"bohr"`` (required: a geometry means nothing without it).
        active_electrons, active_orbitals: active space (None: all).
    """
    if not isinstance(unit, str) or unit.strip().lower() not in ("angstrom", "bohr"):
        raise QdiffError(f"unit must be 'angstrom' or 'bohr'; got {unit!r}")
    unit = unit.strip().lower()  # as PennyLane reads it
    if isinstance(coordinates, torch.Tensor) and coordinates.requires_grad:
        raise QdiffError("molecular_problem: coordinates require grad, but the Hamiltonian is "
                         "not differentiable with respect to the geometry; pass "
                         "coordinates.detach()")
    try:
        names = [] if isinstance(symbols, str) else list(symbols)
    except TypeError:
        names = []
    if not names or not all(isinstance(s, str) for s in names):
        raise QdiffError(f"molecular_problem: symbols must be a non-empty list of atomic symbols "
                         f"such as ['H', 'H']; got {symbols!r}")
    symbols = [str(s) for s in names]
    try:
        raw = np.asarray(coordinates)
        if raw.dtype.kind == "c":  # never cut to the real part
            raise TypeError(f"got {raw.dtype} values")
        if raw.dtype.kind in "USO" and any(isinstance(x, (str, bytes))
                                          for x in raw.reshape(-1).tolist()):
            raise TypeError("got text, not numbers")
        coords = tuple(float(x) for x in np.asarray(coordinates, dtype=float).reshape(-1))
    except (TypeError, ValueError) as e:
        raise QdiffError(f"coordinates must be numbers; {e}") from None
    if len(coords) != 3 * len(symbols):
        raise QdiffError(f"{len(symbols)} atom(s) need {3 * len(symbols)} coordinates; got "
                         f"{len(coords)}")
    bad = [i for i, x in enumerate(coords) if not np.isfinite(x)]
    if bad:
        raise QdiffError(f"molecular_problem: coordinate {bad[0]} (atom {bad[0] // 3}, "
                         f"{symbols[bad[0] // 3]!r}) is {coords[bad[0]]}; coordinates must be "
                         "finite")
    xyz = np.array(coords).reshape(-1, 3)
    for i in range(len(xyz)):
        for j in range(i + 1, len(xyz)):
            if np.array_equal(xyz[i], xyz[j]):
                raise QdiffError(f"molecular_problem: atoms {i} ({symbols[i]!r}) and {j} "
                                 f"({symbols[j]!r}) are both at {xyz[i].tolist()} {unit}; the "
                                 "nuclear repulsion of coincident atoms is infinite")
    for name, v in (("basis", basis), ("mapping", mapping), ("method", method)):
        if not isinstance(v, str):
            raise QdiffError(f"molecular_problem: {name} must be a string; got {v!r}")
    for name, v in (("charge", charge), ("mult", mult)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise QdiffError(f"molecular_problem: {name} must be an integer; got {v!r}")
    for name, v in (("active_electrons", active_electrons), ("active_orbitals", active_orbitals)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise QdiffError(f"molecular_problem: {name} must be an integer or None; got {v!r}")
    if mult < 1:
        raise QdiffError(f"molecular_problem: mult is the spin multiplicity 2S + 1, at least 1; "
                         f"got {mult}")
    charge, mult = int(charge), int(mult)
    active_electrons = None if active_electrons is None else int(active_electrons)
    active_orbitals = None if active_orbitals is None else int(active_orbitals)
    mapping = mapping.strip().lower()  # as PennyLane reads it
    try:
        coeffs, terms, n, n_el = _cached(tuple(symbols), coords, unit, charge, mult, basis,
                                         active_electrons, active_orbitals, mapping, method)
    except QdiffError:
        raise
    except (ValueError, KeyError, TypeError, ImportError) as e:  # PennyLane's refusal
        raise QdiffError(f"molecular Hamiltonian of {list(symbols)} (charge={charge}, "
                         f"mult={mult}, basis={basis!r}, active_electrons={active_electrons}, "
                         f"active_orbitals={active_orbitals}, mapping={mapping!r}, "
                         f"method={method!r}): {e}") from None
    electrons = active_electrons if active_electrons is not None else n_el
    if n_el < 0 or electrons > n:
        what = (f"charge={charge} leaves {n_el} electrons" if n_el < 0 else
                f"{electrons} electrons (charge={charge}) do not fit in its {n} spin orbitals")
        raise QdiffError(f"molecular Hamiltonian of {list(symbols)}: {what}; no such state "
                         f"exists")
    obs = Observable(coeffs.clone(), terms, simplify=False)
    return MolecularProblem(obs, n, electrons, tuple(symbols), coords, unit,
                            extra=dict(total_electrons=n_el, basis=basis, mapping=mapping))


def molecule(name: str, **overrides) -> MolecularProblem:
    """A preset molecule of the VQE examples: ``"H2"``, ``"LiH"`` (10 qubits), ``"LiH-12"``,
    ``"BeH2"`` (12 qubits); keyword arguments override the preset."""
    if not isinstance(name, str) or name not in PRESETS:
        raise QdiffError(f"unknown molecule preset {name!r}; choose from {sorted(PRESETS)}")
    valid = ("symbols", "coordinates") + _OPTIONS
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise QdiffError(f"molecule: unknown keyword(s) {unknown}; valid: {list(valid)}")
    if "unit" in overrides and "coordinates" not in overrides:
        raise QdiffError(f"molecule: unit={overrides['unit']!r} without coordinates; the "
                         f"preset {name!r} is in angstrom (give coordinates in that unit)")
    kw = dict(PRESETS[name], unit="angstrom")
    kw.update(overrides)
    return molecular_problem(kw.pop("symbols"), kw.pop("coordinates"), **kw)
