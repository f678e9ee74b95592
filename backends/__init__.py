"""Backends: the Backend protocol, the embedded torch statevector simulator, and the
Qiskit Aer, IBM Runtime and PennyLane executors (imported lazily)."""
from qdiff.backends.base import Backend, Capabilities, available, device, register_backend
from qdiff.backends.statevector import StatevectorBackend

__all__ = ["Backend", "Capabilities", "available", "device", "register_backend", "StatevectorBackend"]
