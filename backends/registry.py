"""``qd.device(name, ...)``: the backends by name, and what they can create.

The registry sits above the engines: it imports them (Qiskit- and PennyLane-based ones only on
first use), while each engine knows only the protocol in :mod:`qdiff.backends.base`.

>>> import qdiff as qd
>>> qd.device("statevector", wires=3)
<StatevectorBackend wires=3>
"""
from __future__ import annotations

import importlib
from typing import Optional

from qdiff.backends.base import Backend, registered
from qdiff.circuits.errors import QdiffError

# backends whose modules import heavy toolkits: imported on first use by device()
_LAZY = {"aer": "qdiff.backends.aer", "qiskit.aer": "qdiff.backends.aer",
         "aer_simulator": "qdiff.backends.aer", "ibm": "qdiff.backends.ibm",
         "qiskit.ibm": "qdiff.backends.ibm", "ibm_runtime": "qdiff.backends.ibm",
         "pennylane": "qdiff.backends.pennylane_device", "pl": "qdiff.backends.pennylane_device"}


def _builtin() -> None:
    import qdiff.backends.statevector  # noqa: F401  (registers the default engine)
    import qdiff.backends.mixed  # noqa: F401  (registers the density-matrix engine)


def device(name: str = "statevector", /, wires=None, **kwargs) -> Backend:
    """Create a backend by name: ``"statevector"`` (default), ``"mixed"`` (density matrices,
    noise), ``"aer"``, ``"ibm"``, ``"pennylane"``.

    ``name`` is positional-only, so backends may take a ``name=`` option of their own
    (``qd.device("pennylane", name="lightning.qubit", wires=4)``).

    >>> import qdiff as qd
    >>> qd.device("statevector", wires=2, shots=100)
    <StatevectorBackend wires=2, shots=100>
    """
    _builtin()
    if not isinstance(name, str):
        raise QdiffError(f"device name must be a string; got {type(name).__name__}")
    key = name.lower()
    if key not in registered() and key in _LAZY:
        importlib.import_module(_LAZY[key])  # registers it; qiskit/pennylane load only now
    factories = registered()
    if key not in factories:
        names = sorted(set(factories) | set(_LAZY))
        hint = ""
        if "." in key:  # PennyLane's device names: default.qubit, lightning.qubit, ...
            hint = (f"; '{name}' looks like a PennyLane device: run it through qdiff with "
                    f"qd.device(\"pennylane\", name=\"{name}\", wires=...)"
                    + (" (qdiff's own simulator is qd.device(\"statevector\", wires=...))"
                       if key.startswith("default.") else ""))
        raise QdiffError(f"unknown device '{name}'{hint}; available: {names}")
    if wires is None:
        raise QdiffError(f"device '{name}' needs wires= (a number of wires or a sequence of "
                         f"labels)")
    _check_keywords(name, factories[key], kwargs)
    return factories[key](wires=wires, **kwargs)


def _check_keywords(name: str, factory, kwargs: dict) -> None:
    """An unknown keyword is a QdiffError listing the device's keywords, not a TypeError."""
    import inspect
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n, p in params.items() if n != "self" and p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise QdiffError(f"device '{name}': unknown keyword(s) {unknown}; valid keywords: "
                         f"{valid}")


def available(kind: Optional[str] = None):
    """What ``qd.device`` can create.

    ``available()`` -> ``{"devices": [...], "ibm": [fake backend names], "pennylane": [...]}``;
    ``available("devices" | "ibm" | "pennylane")`` -> that list. IBM names are the fake
    backends qiskit-ibm-runtime ships (``fake_manila``, ``fake_sherbrooke``, ...); real
    device names depend on the account and are not listed (``service.backends()``).
    """
    kinds = ("devices", "ibm", "pennylane")
    if kind is not None and kind not in kinds:
        raise QdiffError(f"available(kind) takes one of {list(kinds)}; got {kind!r}")
    out = {}
    if kind in (None, "devices"):
        _builtin()
        out["devices"] = sorted(set(registered()) | set(_LAZY))
    if kind in (None, "ibm"):
        from qdiff.backends.ibm import fake_backend_names
        out["ibm"] = fake_backend_names()
    if kind in (None, "pennylane"):
        from qdiff.backends.pennylane_device import pennylane_device_names
        out["pennylane"] = pennylane_device_names()
    return out if kind is None else out[kind]
