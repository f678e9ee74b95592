"""Text drawings of circuits: ``qd.draw(qnode)(*args)``.

>>> import qdiff as qd
>>> dev = qd.device("statevector", wires=2)
>>> @qd.qnode(dev)
... def f(x):
...     qd.RX(x, wires=0); qd.CNOT([0, 1]); return qd.expval(qd.Z(1))
>>> print(qd.draw(f)(0.5))
0: ──RX(0.50)──╭●──┤
1: ────────────╰X──┤  <Z>
"""
from __future__ import annotations

import torch

from qdiff.circuits.operation import ParamRef

_CTRL_TARGET = {"cx": "X", "cy": "Y", "cz": "Z", "ch": "H", "ccx": "X", "ccz": "Z", "cswap": "SWAP",
                "crx": "RX", "cry": "RY", "crz": "RZ", "cp": "Rϕ", "crot": "Rot"}


def _fmt(p, theta, decimals) -> str:
    if isinstance(p, ParamRef):
        v = theta[0, p.index] * p.scale + p.offset if theta.numel() else 0.0
        v = v.detach() if isinstance(v, torch.Tensor) else v
        return f"{float(v):.{decimals}f}" if theta.shape[0] == 1 else f"θ{p.index}"
    return f"{float(p):.{decimals}f}"


# the label of a controlled gate's innermost target
_TARGET_LABEL = {"x": "X", "y": "Y", "z": "Z", "h": "H", "swap": "SWAP", "rx": "RX", "ry": "RY",
                 "rz": "RZ", "p": "Rϕ", "rot": "Rot"}


def _labels(op, theta, decimals):
    params = "" if decimals is None else ",".join(_fmt(p, theta, decimals) for p in op.params)
    c, gate = op.gate.unwrap_controls()  # controls of controls, outermost first
    if c:
        target = (_CTRL_TARGET.get(op.name) if gate is op.gate.target else None) or \
            _TARGET_LABEL.get(gate.name) or gate.pl_name or gate.name
        t = target + (f"({params})" if params else "")
        return ["●"] * c + [t] * (len(op.wires) - c)
    label = (op.gate.pl_name or op.name) + (f"({params})" if params else "")
    return [label] * len(op.wires)


# a measurement of an observable: <Z> for expval, Var[Z] for var, ... (PennyLane's labels)
_OBS_LABEL = {"expval": "<{}>", "var": "Var[{}]", "sample": "Sample[{}]", "counts": "Counts[{}]"}


def _measurement(m, n: int) -> tuple:
    """``(wires, label)`` of one measurement: a single Pauli word with coefficient 1 by its
    letters (``<Z@Z>``), any other observable (sums, coefficients, Hermitian matrices) as 𝓗."""
    if m.obs is None:
        return tuple(m.wires if m.wires is not None else range(n)), m.kind
    terms = m.obs.terms
    wires = tuple(dict.fromkeys(w for t in terms for f in t for w in f.wires))
    word = len(terms) == 1 and float(m.obs.coeffs.detach().reshape(-1)[0]) == 1.0 and \
        all(f.kind != "M" for f in terms[0])
    name = "@".join(f.kind for f in terms[0]) if word else "𝓗"
    return wires, _OBS_LABEL[m.kind].format(name or "I")


def _measurement_columns(circuit) -> list:
    """One list of cells per wire: each measurement in the first column free over the wires
    it spans, bracketed (╭ ├ ╰, │ across wires between) when it spans several."""
    n = circuit.num_wires
    cols: list = []  # per column: {wire: cell}
    for m in circuit.measurements:
        wires, label = _measurement(m, n)
        if not wires:
            continue
        lo, hi = min(wires), max(wires)
        at = next((i for i in range(len(cols) - 1, -1, -1)
                   if any(w in cols[i] for w in range(lo, hi + 1))), -1) + 1
        if at == len(cols):
            cols.append({})
        for w in range(lo, hi + 1):
            mark = " " if lo == hi else "╭" if w == lo else "╰" if w == hi else \
                "├" if w in wires else "│"
            cols[at][w] = mark + (label if w in wires else "")
    out = [[] for _ in range(n)]
    for col in cols:
        width = max(len(c) for c in col.values())
        for w in range(n):
            out[w].append(col.get(w, "").ljust(width))
    return out


def draw_circuit(circuit, theta=None, decimals: int = 2) -> str:
    n = circuit.num_wires
    theta = theta if theta is not None else torch.zeros(1, circuit.num_params)
    lines = [[] for _ in range(n)]
    length = [0] * n  # len("".join(lines[w])), kept as the pieces are appended
    for op in circuit.operations:
        labels = _labels(op, theta, decimals)
        lo, hi = min(op.wires), max(op.wires)
        width = max(len(s) for s in labels)
        cur = max(length[lo:hi + 1])
        for w in range(lo, hi + 1):
            lines[w].append("─" * (cur - length[w]))
        for w in range(lo, hi + 1):
            if w in op.wires:
                s = labels[op.wires.index(w)]
                if hi > lo:
                    s = ("╭" if w == lo else "╰" if w == hi else "├") + s
                else:
                    s = s
            else:
                s = "│"
            lines[w].append("──" + s.ljust(width + (1 if hi > lo else 0), "─"))
            length[w] = cur + len(lines[w][-1])
    total = max((len("".join(l)) for l in lines), default=0)
    meas = _measurement_columns(circuit)
    width_label = max(len(str(l)) for l in circuit.labels)
    out = []
    for w in range(n):
        body = "".join(lines[w])
        body += "─" * (total - len(body)) + "──┤"
        tail = " ".join(meas[w]).rstrip()
        out.append(f"{str(circuit.labels[w]).rjust(width_label)}: {body}" +
                   (" " + tail if tail else ""))
    return "\n".join(out)


LEVELS = ("top", "device")


def draw(qnode, decimals: int = 2, level: str = "top"):
    """``draw(qnode)(*args)`` returns a text drawing of the circuit recorded for those args:
    as written (``level="top"``), or as it runs on the device (``level="device"``: on a device
    with a device noise model, the routed and translated circuit, :mod:`qdiff.noise`).
    Angles show ``decimals`` digits; ``decimals=None`` leaves them out, as PennyLane's."""
    from qdiff.circuits.errors import QdiffError
    if decimals is not None and (isinstance(decimals, bool) or not isinstance(decimals, int)
                                 or decimals < 0):
        raise QdiffError(f"draw: decimals must be a non-negative integer or None; got "
                         f"{decimals!r}")
    if level not in LEVELS:
        raise QdiffError(f"draw: level must be one of {list(LEVELS)}; got {level!r}")
    from qdiff.specs import as_qnode, split_shots
    qnode = as_qnode(qnode, "draw")

    def wrapper(*args, **kwargs):
        _, kwargs = split_shots(qnode, kwargs)  # the drawing is the same for any shots
        rec, _ = qnode.construct(*args, **kwargs)
        if level == "device":
            from qdiff.bridge import deferred_backend
            from qdiff.noise import route_recorded
            # widened by deferred measurements, refused on a noisy device as a call is
            rec = route_recorded(rec, deferred_backend(qnode.device, rec.circuit, {}))
        return draw_circuit(rec.circuit, rec.theta, decimals)
    return wrapper
