"""PennyLane's ``qml.qnn`` names: ``qd.qnn.TorchLayer`` is :class:`QuantumLayer` with
``TorchLayer``'s signature ``(qnode, weight_shapes, init_method=None)``.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2)
>>> @qd.qnode(dev)
... def circuit(inputs, weights):
...     qd.AngleEmbedding(inputs, wires=range(2))
...     qd.BasicEntanglerLayers(weights, wires=range(2))
...     return [qd.expval(qd.Z(i)) for i in range(2)]
>>> layer = qd.qnn.TorchLayer(circuit, {"weights": (3, 2)})
>>> layer(torch.rand(5, 2)).dtype == torch.get_default_dtype()
True
"""
from __future__ import annotations

from typing import Callable, Optional, Union

from qdiff.circuits.errors import QdiffError, checked_call
from qdiff.hybrid.layer import QuantumLayer


class TorchLayer(QuantumLayer):
    """A qnode as a ``torch.nn.Module`` (PennyLane's ``qml.qnn.TorchLayer``): weights in
    ``torch.get_default_dtype()`` (a floating tensor from ``init_method`` keeps its dtype),
    initialised by ``init_method`` (a callable, a dict of callables or tensors per weight;
    default uniform on [0, 2 pi))."""

    @checked_call
    def __init__(self, qnode, weight_shapes: dict,
                 init_method: Optional[Union[Callable, dict]] = None):
        super().__init__(qnode, weight_shapes, init_method)

    @classmethod
    def from_qiskit(cls, *args, **kwargs):
        """Not on ``TorchLayer`` (PennyLane's has none): use ``qd.QuantumLayer.from_qiskit``."""
        raise QdiffError("TorchLayer.from_qiskit does not exist; use "
                         "qd.QuantumLayer.from_qiskit(...)")


__all__ = ["TorchLayer"]
