"""qdiff's statevector engine as a PennyLane device: ``qml.device("qdiff.statevector")``.

PennyLane finds the device through the ``pennylane.plugins`` entry point; this package imports
PennyLane itself, so nothing else in qdiff imports it eagerly.
"""
from qdiff.backends.pennylane_plugin.device import QdiffStatevector

__all__ = ["QdiffStatevector"]
