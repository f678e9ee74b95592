"""Pass: merge adjacent rotations about the same axis (rz rz -> rz, t s -> rz(3pi/4), ...).

Angles that are ParamRefs of one theta column stay affine ParamRefs, so a merged parametric
gate is still differentiable with the same gradient.

>>> from qdiff.circuits import Circuit, ParamRef
>>> from qdiff.compiler.ops import op
>>> merge_rotations(Circuit(1, (op("rz", (0,), (ParamRef(0),)), op("t", (0,))), num_params=1)).operations
(RZ(ParamRef(index=0, scale=1.0, offset=0.7853981633974483), wires=[0]),)
"""
from qdiff.compiler import peephole


def merge_rotations(circuit):
    """Circuit -> Circuit with runs of same-axis rotations combined."""
    return peephole.run(circuit, peephole.rotation_merge, peephole.disjoint)
