"""What one compilation did: counts before/after, time, verification, the passes' log."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class CompileReport:
    """Counts are two-qubit gates (``cx``: any two-qubit gate of the basis), circuit depth and
    gate totals; ``verified`` is None when verification was switched off."""

    name: str = "<circuit>"
    num_qubits: int = 0
    level: int = 2
    basis: str = "cx,u"
    cx_before: int = 0
    cx_after: int = 0
    depth_before: int = 0
    depth_after: int = 0
    gates_before: int = 0
    gates_after: int = 0
    seconds: float = 0.0
    verified: bool | None = None
    method: str = "none"
    infidelity: float = float("nan")
    strategy: str = ""
    log: list = field(default_factory=list)
    measurements: list = field(default_factory=list)
    num_clbits: int = 0
    target: str | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["infidelity"] = None if d["infidelity"] != d["infidelity"] else d["infidelity"]
        return d

    def summary(self) -> str:
        v = {True: "yes", False: "FAILED", None: "off"}[self.verified]
        return (f"{self.name}: CX {self.cx_before} -> {self.cx_after}, depth {self.depth_before}"
                f" -> {self.depth_after}, gates {self.gates_before} -> {self.gates_after}, "
                f"{self.seconds:.2f} s, verified {v} ({self.method})")


COLUMNS = ("file", "qubits", "CX in", "CX out", "depth in", "depth out", "gates in",
           "gates out", "time s", "verified")


def rows(reports) -> list:
    out = []
    for r in reports:
        v = {True: "yes", False: "FAILED", None: "off"}[r.verified]
        out.append((r.name, r.num_qubits, r.cx_before, r.cx_after, r.depth_before, r.depth_after,
                    r.gates_before, r.gates_after, f"{r.seconds:.2f}", f"{v} ({r.method})"))
    if len(reports) > 1:
        out.append(("TOTAL", "", sum(r.cx_before for r in reports),
                    sum(r.cx_after for r in reports), sum(r.depth_before for r in reports),
                    sum(r.depth_after for r in reports), sum(r.gates_before for r in reports),
                    sum(r.gates_after for r in reports),
                    f"{sum(r.seconds for r in reports):.2f}",
                    f"{sum(1 for r in reports if r.verified)}/{len(reports)}"))
    return out


def table(reports) -> str:
    """A plain-text table (one row per circuit, a TOTAL row when there are several)."""
    body = [tuple(str(x) for x in r) for r in rows(reports)]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h)
              for i, h in enumerate(COLUMNS)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(COLUMNS), line(["-" * w for w in widths])] + [line(r) for r in body])
