"""``qd.noise``: noise models for the mixed-state engine and the trajectory method.

* ``NoiseModel()`` with ``.add(gate, channel, *params, wires=None)`` ("after gate G on wires W
  insert channel C") and ``.add_readout(wire, p01, p10)``;
* ``from_backend("fake_manila")`` (any fake IBM device), a Qiskit backend, or a
  ``qiskit_aer.noise.NoiseModel``: Aer's gate errors of the device (thermal relaxation from
  T1/T2 and gate times, composed with depolarizing errors) as channels with Aer's Kraus
  operators, and its readout errors;
* ``native(circuit, model)``: whether a circuit already uses only the device's basis gates on
  coupled qubit pairs (wire ``i`` = device qubit ``i``); a circuit that does not is refused
  with a message naming the gate: translate and route it first (``qd.compile(...,
  target=NAME)``).

>>> import qdiff as qd
>>> m = qd.noise.NoiseModel().add("cx", qd.DepolarizingChannel, 0.02)
>>> dev = qd.device("mixed", wires=2, noise=m)
>>> @qd.qnode(dev)
... def bell():
...     qd.Hadamard(0); qd.CNOT([0, 1])
...     return qd.purity([0, 1])
>>> round(float(bell()), 6)
0.923143
"""
from __future__ import annotations

from qdiff.circuits.errors import QdiffError
from qdiff.circuits.noise import NoiseModel, NoiseRule, from_qiskit

__all__ = ["NoiseModel", "NoiseRule", "from_backend", "native"]


def from_backend(source, name=None) -> NoiseModel:
    """A :class:`NoiseModel` from a fake IBM device name (``"fake_manila"``), a Qiskit backend,
    or a ``qiskit_aer.noise.NoiseModel`` (see the module)."""
    return from_qiskit(source, name)


def native(circuit, model: NoiseModel) -> bool:
    """Whether ``circuit`` (a :class:`~qdiff.circuits.Circuit`) runs as written on
    ``model``'s device: basis gates only, two-qubit gates on coupled pairs."""
    try:
        model.check_native(circuit)
    except QdiffError:
        return False
    return True
