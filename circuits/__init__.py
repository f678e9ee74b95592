"""The circuit IR: gates, operations, circuits, observables, measurements, templates, QASM I/O.

Names load on first use (PEP 562), so ``from qdiff.circuits.errors import QdiffError`` does not
import torch.
"""
import importlib

_EXPORTS = {
    "QdiffError": "errors", "QdiffMemoryError": "errors", "QdiffParseError": "errors",
    "GATES": "gates", "Gate": "gates", "get_gate": "gates", "register_gate": "gates",
    "Operation": "operation", "ParamRef": "operation",
    "Circuit": "circuit", "Recorded": "circuit", "StatePrep": "circuit",
    "Hamiltonian": "observables", "Hermitian": "observables", "Observable": "observables",
    "Measurement": "measurements", "record": "recording",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'qdiff.circuits' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"qdiff.circuits.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = sorted(_EXPORTS)
