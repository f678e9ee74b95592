"""Backends: the Backend protocol (:mod:`qdiff.backends.base`), the device registry, the
embedded statevector engine, and the Qiskit Aer, IBM Runtime and PennyLane executors (imported
lazily)."""
from qdiff.backends.base import Backend, Capabilities, Job, Result, register_backend
from qdiff.backends.registry import available, device
from qdiff.backends.statevector import StatevectorBackend

__all__ = ["Backend", "Capabilities", "Job", "Result", "available", "device", "register_backend",
           "StatevectorBackend"]
