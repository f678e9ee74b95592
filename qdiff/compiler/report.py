"""What one compilation did: counts before/after, time, verification, the passes' log."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class CompileReport:
    """Counts are two-qubit gates (``cx``: the basis's two-qubit gate, named by ``two_q``:
    cx, cz or ecr), circuit depth, gate totals and T gates; ``verified`` is None when
    verification was switched off. ``infidelity`` is the measured process infidelity of the
    output against the input (``method``: full unitary or random states; for a parametric
    circuit it names the random parameter bindings compared, a sample, not a proof);
    ``approx`` the budget that was allowed (None: exact) and ``approx_bound`` the proven
    bound on what the approximations spent; ``time_cut`` is True when ``--time-limit``
    stopped the search before its work budget (``work`` units used) was spent; ``barriers``
    counts the input's barriers kept (the parts between them are optimized separately)."""

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
    registers: list = field(default_factory=list)  # the input's classical registers
    target: str | None = None
    two_q: str = "cx"
    t_before: int = 0
    t_after: int = 0
    approx: float | None = None
    approx_bound: float | None = None
    time_cut: bool = False
    work: float = 0.0
    barriers: int = 0  # the input's barriers kept (no gate was moved across one)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["infidelity"] = None if d["infidelity"] != d["infidelity"] else d["infidelity"]
        return d

    def summary(self) -> str:
        v = {True: "yes", False: "FAILED", None: "off"}[self.verified]
        cut = ", time limit cut the search" if self.time_cut else ""
        return (f"{self.name}: {self.two_q.upper()} {self.cx_before} -> {self.cx_after}, depth "
                f"{self.depth_before} -> {self.depth_after}, gates {self.gates_before} -> "
                f"{self.gates_after}, {self.seconds:.2f} s, verified {v} ({self.method}, "
                f"1-F = {_fmt(self.infidelity)}{_approx(self)}){cut}")


def _fmt(x) -> str:
    return "-" if x is None or x != x else f"{x:.1e}"


def _approx(r) -> str:
    return "" if r.approx is None else f" within approx {r.approx:g}"


def columns(reports) -> tuple:
    """Column names; the two-qubit columns name the basis's gate (CX, CZ or ECR)."""
    g = "/".join(sorted({r.two_q.upper() for r in reports})) or "CX"
    return ("file", "qubits", f"{g} in", f"{g} out", "depth in", "depth out", "gates in",
            "gates out", "time s", "1-F", "verified")


def rows(reports) -> list:
    out = []
    for r in reports:
        v = {True: "yes", False: "FAILED", None: "off"}[r.verified]
        cut = ", time cut" if r.time_cut else ""
        out.append((r.name, r.num_qubits, r.cx_before, r.cx_after, r.depth_before, r.depth_after,
                    r.gates_before, r.gates_after, f"{r.seconds:.2f}", _fmt(r.infidelity),
                    f"{v} ({r.method}{cut})"))
    if len(reports) > 1:
        out.append(("TOTAL", "", sum(r.cx_before for r in reports),
                    sum(r.cx_after for r in reports), sum(r.depth_before for r in reports),
                    sum(r.depth_after for r in reports), sum(r.gates_before for r in reports),
                    sum(r.gates_after for r in reports),
                    f"{sum(r.seconds for r in reports):.2f}", "",
                    f"{sum(1 for r in reports if r.verified)}/{len(reports)}"))
    return out


def table(reports) -> str:
    """A plain-text table (one row per circuit, a TOTAL row when there are several)."""
    body = [tuple(str(x) for x in r) for r in rows(reports)]
    head = columns(reports)
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h)
              for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in body])
