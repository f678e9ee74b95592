"""Partition a gate list into blocks of at most ``k`` qubits (constant gates only).

Greedy in gate order: a gate joins the open blocks on its wires when their union stays within
``k`` qubits, otherwise those blocks close and it opens a new one. A block is emitted at the
position of its last gate, which is valid because every gate it jumps over acts on other wires.

>>> from qdiff.compiler.ops import op
>>> items = partition([op("cx", (0, 1)), op("cx", (1, 2)), op("cx", (2, 3))], 2)
>>> [b.wires for b in items]
[(0, 1), (1, 2), (2, 3)]
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qdiff.compiler.ops import is_constant, matrix
from qdiff.compiler.verify import apply


@dataclass
class Block:
    wires: tuple
    ops: list = field(default_factory=list)
    last: int = -1
    pos: list = field(default_factory=list)  # original indices of ``ops``

    @property
    def cx(self) -> int:
        return sum(1 for o in self.ops if len(o.wires) >= 2)

    def unitary(self) -> np.ndarray:
        return block_unitary(self.ops, self.wires)


def partition(ops, k: int, eligible=is_constant) -> list:
    """Blocks (``Block``; a non-eligible gate is a block of its own) in a valid order."""
    open_: dict = {}
    done: list = []
    for i, o in enumerate(ops):
        touched = {id(open_[w]): open_[w] for w in o.wires if w in open_}
        if not eligible(o) or len(o.wires) > k:
            for b in touched.values():
                _close(b, open_, done)
            done.append(Block(tuple(o.wires), [o], i, [i]))
            continue
        union = set(o.wires).union(*[b.wires for b in touched.values()])
        if len(union) <= k:
            # merged blocks act on disjoint wires, so interleaving by position keeps the order
            pairs = sorted([(p, x) for b in touched.values() for p, x in zip(b.pos, b.ops)]
                           + [(i, o)], key=lambda t: t[0])
            new = Block(tuple(sorted(union)), [x for _, x in pairs], i, [p for p, _ in pairs])
        else:
            for b in touched.values():
                _close(b, open_, done)
            new = Block(tuple(sorted(o.wires)), [o], i, [i])
        for w in new.wires:
            open_[w] = new
    for b in {id(b): b for b in open_.values()}.values():
        done.append(b)
    done.sort(key=lambda b: b.last)
    return done


def _close(b: Block, open_: dict, done: list) -> None:
    for w in b.wires:
        if open_.get(w) is b:
            del open_[w]
    done.append(b)


def block_unitary(ops, wires) -> np.ndarray:
    """``(2**k, 2**k)`` unitary of ``ops`` on ``wires`` (big-endian in ``wires`` order)."""
    k = len(wires)
    d = 2 ** k
    loc = {w: i for i, w in enumerate(wires)}
    st = np.eye(d, dtype=complex).reshape((d,) + (2,) * k)
    for o in ops:
        st = apply(st, matrix(o), tuple(loc[w] for w in o.wires))
    return st.reshape(d, d).T


def flatten(blocks) -> list:
    return [o for b in blocks for o in b.ops]
