"""qdiff: a hybrid quantum-classical differentiable stack on torch.

>>> import torch, qdiff as qd
>>> dev = qd.device("statevector", wires=2)
>>> @qd.qnode(dev)
... def bell(theta):
...     qd.RY(theta, wires=0); qd.CNOT(wires=[0, 1])
...     return qd.expval(qd.Z(0) @ qd.Z(1))
>>> float(bell(torch.tensor(0.3)))
1.0

The front is lazy (PEP 562): ``import qdiff`` loads no submodule; each name below is imported
the first time it is used, so ``qdiff --help`` and scripts that need one corner of the package
start fast. ``dir(qdiff)`` lists every public name.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types

__version__ = "0.1.0"

# public name -> (module, attribute); attribute None: the module itself
_EXPORTS = {
    **{n: ("qdiff.circuits.errors", n) for n in ("QdiffError", "QdiffMemoryError",
                                                  "QdiffParseError")},
    **{n: ("qdiff.circuits.gates", n) for n in ("MultiRZ", "PauliRot", "QubitUnitary", "PCPhase",
                                                 "DiagonalQubitUnitary", "GlobalPhase", "Gate",
                                                 "get_gate", "register_gate",
                                                 "unregister_gate")},
    **{n: ("qdiff.circuits.refusals", n) for n in ("Barrier", "Snapshot", "WireCut", "Projector",
                                                    "BasisStateProjector",
                                                    "StateVectorProjector", "SpecialUnitary",
                                                    "BlockEncode", "IntegerComparator",
                                                    "QubitDensityMatrix", "SparseHamiltonian",
                                                    "TmpPauliRot")},
    "Operation": ("qdiff.circuits.operation", "Operation"),
    "ParamRef": ("qdiff.circuits.operation", "ParamRef"),
    "Circuit": ("qdiff.circuits.circuit", "Circuit"),
    **{n: ("qdiff.circuits.observables", n) for n in ("Hamiltonian", "Hermitian", "Observable")},
    **{n: ("qdiff.circuits.measurements", n) for n in ("counts", "expval", "probs", "sample",
                                                        "state", "var", "density_matrix",
                                                        "purity")},
    **{n: ("qdiff.circuits.channels", n) for n in (
        "BitFlip", "PhaseFlip", "DepolarizingChannel", "AmplitudeDamping",
        "GeneralizedAmplitudeDamping", "PhaseDamping", "ThermalRelaxationError", "ResetError",
        "PauliError", "QubitChannel", "Channel")},
    **{n: ("qdiff.circuits.transforms", n) for n in ("adjoint", "ctrl", "MultiControlledX",
                                                      "ControlledQubitUnitary")},
    **{n: ("qdiff.circuits.midcircuit", n) for n in ("cond", "measure")},
    "record": ("qdiff.circuits.recording", "record"),
    "clear_caches": ("qdiff.circuits.caches", "clear"),
    **{n: ("qdiff.circuits.templates", n) for n in (
        "AllSinglesDoubles", "AmplitudeEmbedding", "AngleEmbedding", "BasicEntanglerLayers",
        "BasisState", "HardwareEfficientAnsatz", "IQPEmbedding", "QAOALayers", "QFT", "StatePrep",
        "StronglyEntanglingLayers", "cost_layer", "excitations", "mixer_layer", "x_mixer")},
    "hf_state": ("qdiff.qchem", "hf_state"),  # every basis (Jordan-Wigner, parity, BK)
    "Backend": ("qdiff.backends.base", "Backend"),
    "device": ("qdiff.backends.registry", "device"),
    "native_status": ("qdiff.backends.statevector.native_lib", "native_status"),
    "QNode": ("qdiff.qnode", "QNode"),
    "qnode": ("qdiff.qnode", "qnode"),
    "jit": ("qdiff.static", "jit"),
    "StaticQNode": ("qdiff.static", "StaticQNode"),
    "draw": ("qdiff.draw", "draw"),
    "QuantumLayer": ("qdiff.hybrid", "QuantumLayer"),
    "qnn": ("qdiff.hybrid.qnn", None),
    "specs": ("qdiff.specs", "specs"),
    "compile": ("qdiff.compiler.api", "compile"),
    "PauliSumOperator": ("qdiff.operators", "PauliSumOperator"),
    **{n: ("qdiff.solvers", n) for n in ("SolverInfo", "cg", "eigsh", "ground_state", "lanczos",
                                          "minres")},
    "qchem": ("qdiff.qchem", None),
    "metric_tensor": ("qdiff.metric", "metric_tensor"),
    "QNGOptimizer": ("qdiff.optimize", "QNGOptimizer"),
}

# Gates under PennyLane's class names (qd.RX, qd.CNOT, ...): the same list the gate registry
# builds, written out so that it is known without importing torch; short aliases map onto them
# (tests/test_startup.py checks both lists against the registry).
_GATE_NAMES = (
    "Identity", "PauliX", "PauliY", "PauliZ", "Hadamard", "S", "Sdg", "T", "Tdg", "SX", "SXdg",
    "RX", "RY", "RZ", "PhaseShift", "U1", "Rot", "U3", "U2", "CNOT", "CY", "CZ", "CH", "SWAP",
    "ISWAP", "ECR", "Toffoli", "CSWAP", "CCZ", "CRX", "CRY", "CRZ", "ControlledPhaseShift",
    "CRot", "IsingXX", "IsingYY", "IsingZZ", "SingleExcitation", "DoubleExcitation", "IsingXY",
    "CPhaseShift00", "CPhaseShift01", "CPhaseShift10", "PSWAP", "SingleExcitationPlus",
    "SingleExcitationMinus", "DoubleExcitationPlus", "DoubleExcitationMinus", "OrbitalRotation",
    "FermionicSWAP", "SISWAP", "QubitCarry", "QubitSum")
_GATE_ALIASES = {"I": "Identity", "X": "PauliX", "Y": "PauliY", "Z": "PauliZ", "H": "Hadamard",
                 "CX": "CNOT", "CCX": "Toffoli", "CPhase": "ControlledPhaseShift",
                 "iSWAP": "ISWAP", "Rxx": "IsingXX", "Ryy": "IsingYY", "Rzz": "IsingZZ",
                 "SQISW": "SISWAP"}


# PennyLane's qubit templates qdiff does not write itself: ``qd.GroverOperator`` is
# ``qml.GroverOperator`` (imported on first use), recorded into a qdiff qnode through
# PennyLane's operator queue and decomposed into qdiff's gates, torch parameters differentiable
# (tests/test_pennylane_templates.py checks the list against PennyLane's)
_PENNYLANE_TEMPLATES = (
    "AQFT", "Adder", "AmplitudeAmplification", "ApproxTimeEvolution", "ArbitraryStatePreparation",
    "ArbitraryUnitary", "BBQRAM", "BasisEmbedding", "BasisRotation", "CommutingEvolution",
    "ControlledSequence", "CosineWindow", "Elbow", "FABLE", "FermionicDoubleExcitation",
    "FermionicSingleExcitation", "FlipSign", "GQSP", "GateFabric", "GroverOperator",
    "HilbertSchmidt", "HybridQRAM", "IQP", "LocalHilbertSchmidt", "MERA", "MPS", "MPSPrep",
    "ModExp", "MottonenStatePreparation", "MultiplexerStatePreparation", "Multiplier",
    "OutAdder", "OutMultiplier", "OutPoly", "ParticleConservingU1", "ParticleConservingU2",
    "Permute", "PhaseAdder", "PrepSelPrep", "QAOAEmbedding", "QDrift", "QROM",
    "QROMStatePreparation", "QSVT", "QuantumMonteCarlo", "QuantumPhaseEstimation",
    "Qubitization", "RandomLayers", "Reflection", "Select", "SelectOnlyQRAM", "SelectPauliRot",
    "SemiAdder", "SimplifiedTwoDesign", "SumOfSlatersPrep", "Superposition", "TTN",
    "TemporaryAND", "TrotterProduct", "TwoLocalSwapNetwork", "UCCSD", "kUpCCGSD")


def _pennylane_template(name: str):
    try:
        import pennylane.templates as templates
    except ImportError:
        raise AttributeError(f"qd.{name} is PennyLane's template qml.{name} (recorded into "
                             "qdiff qnodes); it needs pennylane installed") from None
    from qdiff.circuits import recording
    recording.capture_pennylane_late()  # PennyLane's first import inside a qnode's recording
    value = getattr(templates, name, None)
    if value is None:
        import pennylane
        raise AttributeError(f"qd.{name} is PennyLane's template qml.{name}, which PennyLane "
                             f"{pennylane.__version__} does not have")
    return value


def _gate(pl_name: str):
    from qdiff.circuits.gates import GATES
    import qdiff.circuits.observables  # noqa: F401  (arithmetic on gates makes observables)
    for g in GATES.values():
        if g.pl_name == pl_name:
            return g
    raise AttributeError(f"module 'qdiff' has no attribute {pl_name!r}")


def _outside_transforms():
    """A context in which no torch.func transform is active: a module loaded on first use
    inside ``grad``/``vmap`` builds its constant tensors as plain ones."""
    torch = sys.modules.get("torch")  # not loaded: no transform can be running
    disable = getattr(getattr(torch, "_C", None), "_DisableFuncTorch", None)
    return disable() if disable is not None else contextlib.nullcontext()


def __getattr__(name: str):
    """Import a public name on first use and cache it in the module's namespace."""
    with _outside_transforms():
        value = _load(name)
    globals()[name] = value
    return value


def _load(name: str):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
    elif name in _GATE_NAMES:
        value = _gate(name)
    elif name in _GATE_ALIASES:
        value = _gate(_GATE_ALIASES[name])
    elif name in _PENNYLANE_TEMPLATES:
        value = _pennylane_template(name)
    elif not name.startswith("__") and importlib.util.find_spec(f"qdiff.{name}") is not None:
        value = importlib.import_module(f"qdiff.{name}")  # a submodule: qd.backends, ...
    else:
        raise AttributeError(f"module 'qdiff' has no attribute {name!r}")
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_GATE_NAMES) | set(_GATE_ALIASES) |
                  set(_PENNYLANE_TEMPLATES))


class _Front(types.ModuleType):
    """The package module: importing ``qdiff.qnode`` (or ``qdiff.draw``) binds that submodule
    on the package under the same name as the public function; the front keeps the
    function."""

    def __setattr__(self, name, value):
        spec = _EXPORTS.get(name)
        if spec is not None and spec[1] is not None and isinstance(value, types.ModuleType):
            value = getattr(value, spec[1])
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Front


__all__ = sorted(set(_EXPORTS) | set(_GATE_NAMES) | set(_GATE_ALIASES))
