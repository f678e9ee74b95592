"""VQE for LiH in STO-3G, 1.5949 A, active space of 2 electrons in 5 spatial orbitals (10 qubits, 24 parameters).

The Hamiltonian comes from PennyLane's qchem (its differentiable Hartree-Fock, offline) and is
converted to a qdiff observable (`qdiff.qchem`); the exact energy is qdiff's Lanczos ground
state in the right particle-number/Sz sector. Ansatz: Hartree-Fock state plus every single and
double excitation as Givens rotations (`--ansatz hea` for a hardware-efficient one), Adam
(`--optimizer qng` for quantum natural gradient).

    python examples/vqe_lih.py [--backend statevector|aer|ibm:fake_manila] [--shots N]
                              [--device cpu|cuda] [--steps N] [--plot out.png]
"""
from __future__ import annotations

if __name__ == "__main__":  # first: Ctrl-C during the imports below is one line, exit 130
    import _startup  # noqa: F401

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _vqe_common as common  # noqa: E402


def main(argv=None, log=print):
    args = common.parser(__doc__.splitlines()[0], steps=100, lr=0.05).parse_args(argv)
    common.setup(args)
    return common.main(common.molecular_problem("LiH"), args, log)


if __name__ == "__main__":
    common.run(main)
