"""VQE for H2 in STO-3G at 0.7414 A (4 qubits, 3 Givens parameters).

The Hamiltonian comes from PennyLane's qchem (its differentiable Hartree-Fock, offline) and is
converted to a qdiff observable (`qdiff.qchem`); the exact energy is qdiff's Lanczos ground
state in the right particle-number/Sz sector. Ansatz: Hartree-Fock state plus every single and
double excitation as Givens rotations (`--ansatz hea` for a hardware-efficient one), Adam
(`--optimizer qng` for quantum natural gradient).

    python examples/vqe_h2.py [--backend statevector|aer|ibm:fake_manila] [--shots N]
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
    args = common.parser(__doc__.splitlines()[0], steps=60, lr=0.1).parse_args(argv)
    common.setup(args)
    return common.main(common.molecular_problem("H2"), args, log)


if __name__ == "__main__":
    common.run(main)
