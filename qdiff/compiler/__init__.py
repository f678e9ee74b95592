"""qdiff's circuit compiler: pure passes ``Circuit -> Circuit``, levels 0-3, verified output.

>>> from qdiff.compiler import compile
>>> out, rep = compile('OPENQASM 2.0; include "qelib1.inc"; qreg q[1]; h q[0]; h q[0];')
>>> rep.cx_after, len(out.operations)
(0, 0)
"""
from qdiff.compiler.api import compile
from qdiff.compiler.basis import parse_basis, translate
from qdiff.compiler.cancel import cancel_inverses
from qdiff.compiler.commute import commutative_cancellation
from qdiff.compiler.consolidate import consolidate_2q
from qdiff.compiler.fuse import fuse_1q
from qdiff.compiler.identity import remove_identities
from qdiff.compiler.lower import lower
from qdiff.compiler.merge import merge_rotations
from qdiff.compiler.pipeline import chain, fixpoint, guarded, level1, level2
from qdiff.compiler.report import CompileReport
from qdiff.compiler.verify import equivalence

__all__ = ["compile", "chain", "fixpoint", "guarded", "level1", "level2", "lower", "translate",
           "parse_basis", "cancel_inverses", "merge_rotations", "remove_identities",
           "commutative_cancellation", "fuse_1q", "consolidate_2q", "equivalence",
           "CompileReport"]
