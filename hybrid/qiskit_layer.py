"""``QuantumLayer.from_qiskit``: a Qiskit ``QuantumCircuit`` as a torch layer, in the vocabulary
of Qiskit Machine Learning's ``EstimatorQNN`` + ``TorchConnector``.

>>> import torch, qdiff as qd
>>> from qiskit.circuit.library import real_amplitudes, zz_feature_map
>>> fm, ansatz = zz_feature_map(2), real_amplitudes(2, reps=1)
>>> layer = qd.QuantumLayer.from_qiskit(fm.compose(ansatz), input_params=fm.parameters,
...                                     weight_params=ansatz.parameters)
>>> [tuple(p.shape) for p in layer.parameters()], tuple(layer(torch.rand(5, 2)).shape)
([(4,)], (5, 1))
"""
from __future__ import annotations

from qdiff.circuits.errors import QdiffError


_PRIMITIVE = "the layer simulates on device= (a qdiff device or a name) and differentiates by " \
    "diff_method="
_QISKIT_ML_KEYWORDS = {
    "estimator": _PRIMITIVE, "sampler": _PRIMITIVE, "gradient": _PRIMITIVE,
    "input_gradients": "gradients reach the inputs whenever they require grad (torch autograd)",
    "interpret": "the outputs are the probabilities (B, 2**m) of the measured classical bits' "
                 "integer; map them with a torch operation after the layer",
    "output_shape": "the outputs are the probabilities (B, 2**m) of the measured classical "
                    "bits' integer; map them with a torch operation after the layer",
    "default_precision": "the layer computes exact values (or samples with a device's shots=)",
    "num_virtual_qubits": "observables and outputs act on every qubit of the circuit",
}


def layer_from_qiskit(cls, qc, input_params=None, weight_params=None, observables=None,
                      device=None, diff_method: str = "best", init_method=None, dtype=None,
                      **gradient_kwargs):
    """Build ``cls`` (a :class:`~qdiff.hybrid.layer.QuantumLayer`) around ``qc``; see
    :meth:`QuantumLayer.from_qiskit`."""
    import torch
    import qdiff as qd
    from qdiff.circuit_qnode import CircuitQNode, as_import
    from qdiff.circuits.qiskit_io import is_quantum_circuit
    for key in gradient_kwargs:
        if key in _QISKIT_ML_KEYWORDS:
            raise QdiffError(f"from_qiskit: {key}= is EstimatorQNN/SamplerQNN's keyword, not "
                             f"this layer's: {_QISKIT_ML_KEYWORDS[key]}")
    n = qc.num_qubits if is_quantum_circuit(qc) else \
        as_import(qc).num_qubits
    if device is None or isinstance(device, str):
        device = qd.device(device or "statevector", wires=n)
    from qdiff.backends.base import Backend
    if not isinstance(device, Backend):
        raise QdiffError(f"from_qiskit: device= takes a qdiff device (qd.device(...)) or its "
                         f"name; got {type(device).__name__}")
    if observables is not None and not isinstance(observables, (list, tuple)):
        observables = [observables]  # a layer's output is always (B, K)
    qnode = CircuitQNode(qc, device, diff_method, observables,
                         {"inputs": input_params, "weights": weight_params}, **gradient_kwargs)
    num_weights = qnode.arg_sizes[1]
    if isinstance(init_method, dict):  # {"weights": ...}, as for any QuantumLayer
        pass
    elif init_method is not None and not callable(init_method) and \
            not isinstance(init_method, torch.Tensor):
        import numpy as np
        try:  # through numpy: Python floats stay float64, complex values stay complex
            init_method = torch.as_tensor(np.asarray(init_method))
        except (TypeError, ValueError, RuntimeError):
            raise QdiffError(f"from_qiskit: init_method must be a callable or initial weights "
                             f"({num_weights},); got {type(init_method).__name__}") from None
    if isinstance(init_method, torch.Tensor) and init_method.ndim != 1:
        raise QdiffError(f"initial weights have shape {tuple(init_method.shape)}; expected "
                         f"({num_weights},), in weight_params order")
    return cls(qnode, {"weights": (num_weights,)}, init_method, dtype or torch.float64)
