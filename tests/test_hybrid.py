"""QuantumLayer in torch: nn.Sequential, optimizers, state_dict, dtypes, devices, pickling,
torch.compile, torch.func, DistributedDataParallel — and the cases where PennyLane's TorchLayer
and Qiskit's TorchConnector fail."""
from __future__ import annotations

import io
import math
import os

import numpy as np
import pytest
import torch

import qdiff as qd

N = 3
DEV = qd.device("statevector", wires=N)
ALL_METHODS = ["backprop", "adjoint", "parameter-shift", "finite-diff", "spsa"]


def _body(inputs, weights):
    qd.AngleEmbedding(inputs, wires=range(N))
    qd.StronglyEntanglingLayers(weights, wires=range(N))
    return [qd.expval(qd.Z(i)) for i in range(N)]


@qd.qnode(DEV)
def circuit(inputs, weights):
    return _body(inputs, weights)


def _model(method="best", seed=0, static=False):
    torch.manual_seed(seed)
    q = qd.QNode(_body, DEV, diff_method=method, **({"seed": 1} if method == "spsa" else {}))
    if static:
        q = qd.jit(q)
    layer = qd.QuantumLayer(q, {"weights": qd.StronglyEntanglingLayers.shape(2, N)},
                            dtype=torch.float64)
    return torch.nn.Sequential(torch.nn.Linear(4, N, dtype=torch.float64), layer,
                               torch.nn.Linear(N, 1, dtype=torch.float64))


def test_layer_shapes_batched_and_unbatched():
    layer = qd.QuantumLayer(circuit, {"weights": (2, N, 3)})
    assert layer(torch.rand(7, N, dtype=torch.float64)).shape == (7, N)
    assert layer(torch.rand(N, dtype=torch.float64)).shape == (N,)
    assert [n for n, _ in layer.named_parameters()] == ["weights"]


@pytest.mark.parametrize("method", ALL_METHODS)
def test_every_method_trains_with_batched_inputs_that_require_grad(method):
    """PennyLane's TorchLayer raises NotImplementedError here for param-shift/SPSA/FD (#6078)."""
    model = _model(method)
    x = torch.rand(16, 4, dtype=torch.float64, requires_grad=True)
    y = torch.rand(16, 1, dtype=torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.parameters())
    assert losses[-1] < losses[0]


def test_gradients_equal_across_methods_in_a_model():
    x = torch.rand(5, 4, dtype=torch.float64, requires_grad=True)
    ref = None
    for method in ["backprop", "adjoint", "parameter-shift"]:
        model = _model(method, seed=3)
        xx = x.detach().clone().requires_grad_(True)
        model(xx).sum().backward()
        grads = [xx.grad] + [p.grad for p in model.parameters()]
        if ref is None:
            ref = grads
        else:
            for a, b in zip(ref, grads):
                assert torch.allclose(a, b, atol=1e-9)


def test_batched_parameter_shift_is_one_backend_call():
    class Counting(type(DEV)):
        calls = 0

        def execute(self, *a, **k):
            Counting.calls += 1
            return super().execute(*a, **k)

    dev = Counting(wires=N)
    q = qd.QNode(_body, dev, diff_method="parameter-shift")
    layer = qd.QuantumLayer(q, {"weights": (2, N, 3)})
    x = torch.rand(32, N, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    assert Counting.calls == 1
    out.sum().backward()
    assert Counting.calls == 2  # all shifts of all 32 samples in one call


def test_state_dict_dtype_and_device_moves():
    model = _model()
    sd = model.state_dict()
    model2 = _model(seed=9)
    model2.load_state_dict(sd)
    x = torch.rand(3, 4, dtype=torch.float64)
    assert torch.allclose(model(x), model2(x))
    model2.float()
    out = model2(x.float())
    assert out.dtype == torch.float32  # the user's dtype is kept, not silently changed
    assert torch.allclose(out.double(), model(x), atol=1e-5)
    model2.double().to("cpu")
    assert model2(x).dtype == torch.float64


def test_float32_inputs_keep_dtype_and_gradients():
    """Qiskit ML casts to float32 and drops input grads silently; qdiff keeps both."""
    layer = qd.QuantumLayer(qd.QNode(_body, DEV, diff_method="parameter-shift"),
                            {"weights": (1, N, 3)}).float()
    x = torch.rand(4, N, dtype=torch.float32, requires_grad=True)
    out = layer(x)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32
    assert layer.weights.grad.dtype == torch.float32


def test_torch_save_load_round_trip(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, N, dtype=torch.float64),
                                qd.QuantumLayer(circuit, {"weights": (2, N, 3)}))
    x = torch.rand(3, 4, dtype=torch.float64)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    assert torch.allclose(loaded(x), model(x))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)


# module-level qnodes bound to names other than their function's
FAST_CIRCUIT = qd.jit(circuit)
BOUND_QNODE = qd.QNode(_body, DEV, diff_method="parameter-shift")


@pytest.mark.parametrize("name", ["FAST_CIRCUIT", "BOUND_QNODE"])
def test_torch_save_of_a_qnode_bound_to_a_module_level_name(name, tmp_path):
    """``fast = qd.jit(circuit)`` or ``q = qd.QNode(func, dev)`` at module level pickles by
    that name: ``torch.save(model)`` / ``torch.load`` round-trip it."""
    q = globals()[name]
    model = torch.nn.Sequential(torch.nn.Linear(4, N, dtype=torch.float64),
                                qd.QuantumLayer(q, {"weights": (2, N, 3)}, dtype=torch.float64))
    x = torch.rand(3, 4, dtype=torch.float64)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert loaded[1].qnode is q
    torch.testing.assert_close(loaded(x), model(x))


def test_pickling_a_local_qnode_fails_clearly():
    import pickle

    @qd.qnode(DEV)
    def local(inputs):
        qd.RX(inputs, wires=0)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffError, match="module level"):
        pickle.dumps(local)


@pytest.mark.parametrize("kind", ["qnode", "static", "circuit"])
def test_deepcopy_of_a_model_with_a_local_qnode(kind):
    """copy.deepcopy(model) (best-model checkpoints) works whatever scope the qnode was
    defined in, as for PennyLane's TorchLayer; the copy's outputs and gradients are the
    original's and its weights are its own."""
    import copy
    if kind == "circuit":
        from qiskit.circuit import ParameterVector, QuantumCircuit
        from qdiff.circuits.qiskit_io import from_qiskit
        x, w = ParameterVector("x", N), ParameterVector("w", N)
        qc = QuantumCircuit(N)
        for i in range(N):
            qc.rx(x[i], i)
            qc.ry(w[i], i)
        qc.cx(0, 1)
        q = qd.qnode(DEV, arguments={"inputs": x, "weights": w},
                     observables=[qd.Z(i) for i in range(N)])(from_qiskit(qc))
        layer = qd.QuantumLayer(q, {"weights": (N,)}, dtype=torch.float64)
    else:
        @qd.qnode(DEV, static=kind == "static")
        def local(inputs, weights):
            return _body(inputs, weights)
        layer = qd.QuantumLayer(local, {"weights": (2, N, 3)}, dtype=torch.float64)
    model = torch.nn.Sequential(layer, torch.nn.Linear(N, 1, dtype=torch.float64))
    twin = copy.deepcopy(model)
    assert twin[0].weights is not layer.weights
    x = torch.rand(4, N, dtype=torch.float64)
    assert torch.equal(twin(x), model(x))
    g = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    g_twin = torch.autograd.grad(twin(x).sum(), list(twin.parameters()))
    for a, b in zip(g, g_twin):
        assert torch.equal(a, b)
    with torch.no_grad():
        twin[0].weights.add_(0.1)
    assert not torch.equal(twin(x), model(x))


@pytest.mark.parametrize("method,static", [("backprop", False), ("adjoint", False),
                                           ("parameter-shift", False), ("best", True)])
def test_torch_compile_trains_with_same_gradients(method, static):
    """The qnode call, plain or static (whose first call of a signature records it), stays
    eager under torch.compile."""
    model = _model(method, seed=5, static=static)
    x = torch.rand(6, 4, dtype=torch.float64)
    compiled = torch.compile(model)
    out = compiled(x)  # a static qnode's first call under dynamo records its trace
    g_eager = torch.autograd.grad(model(x).pow(2).sum(), list(model.parameters()))
    assert torch.allclose(out, model(x), atol=1e-12)
    g_comp = torch.autograd.grad(compiled(x).pow(2).sum(), list(model.parameters()))
    for a, b in zip(g_eager, g_comp):
        assert torch.allclose(a, b, atol=1e-12)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = float(compiled(x).pow(2).sum())
    for _ in range(3):
        opt.zero_grad()
        compiled(x).pow(2).sum().backward()
        opt.step()
    assert float(compiled(x).pow(2).sum()) < before


@pytest.mark.parametrize("method", ["backprop", "adjoint", "parameter-shift"])
def test_torch_func_grad_and_vmap(method):
    @qd.qnode(DEV, diff_method=method)
    def f(w):
        qd.RX(w[0], wires=0); qd.CRY(w[1], wires=[0, 1]); qd.IsingXX(w[2], wires=[1, 2])
        return qd.expval(qd.Z(0) @ qd.Z(2) + qd.X(1))

    w = torch.tensor([0.3, 0.5, 0.7], dtype=torch.float64)
    wr = w.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(f(wr), wr)
    assert torch.allclose(torch.func.grad(f)(w), ref, atol=1e-10)
    W = torch.rand(4, 3, dtype=torch.float64)
    assert torch.allclose(torch.func.vmap(f)(W), torch.stack([f(x) for x in W]))
    per_sample = torch.func.vmap(torch.func.grad(f))(W)
    for row, x in zip(per_sample, W):
        xr = x.clone().requires_grad_(True)
        assert torch.allclose(row, torch.autograd.grad(f(xr), xr)[0], atol=1e-10)


@pytest.mark.parametrize("method", ["best", "backprop", "adjoint", "parameter-shift"])
def test_vmap_over_checked_matrices_and_states(method):
    """vmap over a Hermitian observable's matrix, a StatePrep/AmplitudeEmbedding state and a
    QubitUnitary matrix: each vmapped slice is checked and the result equals a loop; a bad
    slice is a QdiffError naming what is wrong."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev, diff_method=method)
    def herm(a):
        qd.RX(0.3, 0); qd.CNOT([0, 1])
        return qd.expval(qd.Hermitian(a, wires=[1]))

    @qd.qnode(dev, diff_method=method)
    def prep(v):
        qd.AmplitudeEmbedding(v, wires=[0, 1], normalize=True)
        return qd.expval(qd.Z(0))

    @qd.qnode(dev, diff_method=method)
    def unitary(t):
        x = torch.tensor([[0, 1], [1, 0]], dtype=torch.complex128)
        qd.QubitUnitary(torch.linalg.matrix_exp(-1j * t * x), wires=0)
        return qd.expval(qd.Z(0))

    torch.manual_seed(0)
    a = torch.randn(3, 2, 2, dtype=torch.complex128)
    a = a + a.mH
    for f, batch in ((herm, a), (prep, torch.rand(3, 4, dtype=torch.float64)),
                     (unitary, torch.rand(3, dtype=torch.float64))):
        assert torch.allclose(torch.func.vmap(f)(batch), torch.stack([f(b) for b in batch]),
                              atol=1e-12)
    bad = torch.eye(2, dtype=torch.complex128).repeat(3, 1, 1)
    bad[2, 0, 1] = 1.0
    with pytest.raises(qd.QdiffError, match="not Hermitian"):
        torch.func.vmap(herm)(bad)
    with pytest.raises(qd.QdiffError, match="not unitary"):
        torch.func.vmap(lambda u: unitary_of(u, dev, method))(2 * bad)
    zero = torch.rand(3, 4, dtype=torch.float64)
    zero[1] = 0
    with pytest.raises(qd.QdiffError, match="zero feature vector"):
        torch.func.vmap(prep)(zero)


@pytest.mark.parametrize("method", ["best", "adjoint", "parameter-shift"])
@pytest.mark.parametrize("kind", ["coeffs", "var", "hermitian", "state", "unitary"])
@pytest.mark.parametrize("engine", ["statevector", "mixed"])
def test_per_sample_gradients_with_vmapped_observable_state_or_matrix(engine, kind, method):
    """vmap(grad) and vmap(jacrev) over the angles while the observable, the prepared state
    or a QubitUnitary matrix is vmapped too (one per binding): every rule gives the
    per-binding derivatives of a loop of backprop calls."""
    if engine == "mixed" and method == "adjoint":
        pytest.skip("the mixed device's adjoint is covered in test_mixed_reverse")
    dev = qd.device(engine, wires=2)
    x = torch.tensor([[0, 1], [1, 0]], dtype=torch.complex128)

    def body(w, c):
        if kind == "state":
            qd.StatePrep(c / torch.linalg.norm(c), wires=[0, 1])
        qd.RX(w[0], 0); qd.RY(w[1], 1); qd.CNOT([0, 1])
        if kind == "unitary":
            qd.QubitUnitary(torch.linalg.matrix_exp(-1j * c[0] * x), wires=1)
        if kind == "coeffs":
            return qd.expval(qd.Hamiltonian(c[:2], [qd.Z(0), qd.X(1)]))
        if kind == "var":
            return qd.var(c[0] * qd.Z(0) + qd.X(1))
        if kind == "hermitian":
            a = torch.stack([torch.stack([c[0], c[1]]), torch.stack([c[1], c[2]])])
            return qd.expval(qd.Hermitian(a.to(torch.complex128), wires=[1]))
        return qd.expval(qd.Z(0) @ qd.X(1))

    f = qd.qnode(dev, diff_method=method)(body)
    ref = qd.qnode(dev, diff_method="backprop")(body)
    torch.manual_seed(3)
    w = torch.randn(4, 2, dtype=torch.float64)
    c = torch.rand(4, 4, dtype=torch.float64) + 0.1
    want = torch.stack([torch.func.grad(ref)(w[i], c[i]) for i in range(4)])
    assert torch.allclose(torch.func.vmap(torch.func.grad(f))(w, c), want, atol=1e-10)
    assert torch.allclose(torch.func.vmap(torch.func.jacrev(f))(w, c), want, atol=1e-10)
    shared = torch.func.vmap(torch.func.grad(f), in_dims=(None, 0))(w[0], c)
    assert torch.allclose(shared, torch.stack([torch.func.grad(ref)(w[0], ci) for ci in c]),
                          atol=1e-10)


def test_vmapped_observable_under_rules_outside_torch_is_refused():
    dev = qd.device("statevector", wires=2, shots=100, seed=1)

    @qd.qnode(dev, diff_method="parameter-shift")
    def f(w, c):
        qd.RX(w[0], 0); qd.RY(w[1], 1)
        return qd.expval(qd.Hamiltonian(c, [qd.Z(0), qd.X(1)]))

    w, c = torch.rand(3, 2, dtype=torch.float64), torch.rand(3, 2, dtype=torch.float64)
    with pytest.raises(qd.QdiffError, match="vmap over the observable"):
        torch.func.vmap(torch.func.grad(f))(w, c)


def unitary_of(u, dev, method):
    @qd.qnode(dev, diff_method=method)
    def f(m):
        qd.QubitUnitary(m, wires=0)
        return qd.expval(qd.Z(0))
    return f(u)


@pytest.mark.parametrize("dev_kw", [{"name": "statevector"},
                                    {"name": "statevector", "dtype": torch.complex64},
                                    {"name": "mixed"}])
def test_torch_func_forward_mode_leaves_no_transformed_tensor_in_caches(dev_kw):
    """Caches filled during a hessian / jacfwd hold plain tensors: later transforms and plain
    calls of this and of new qnodes with the same circuit keep working."""
    qd.clear_caches()  # the first call of this circuit structure runs inside the transforms
    kw = dict(dev_kw)
    name = kw.pop("name")
    real = torch.float32 if kw.get("dtype") == torch.complex64 else torch.float64
    tol = 1e-5 if real == torch.float32 else 1e-10

    def body(v):
        qd.RX(v[0], 0); qd.RY(v[1], 1); qd.CNOT([0, 1]); qd.RZ(0.3, 2)
        return (qd.expval(qd.Z(0)), qd.expval(qd.Z(0) @ qd.Z(1) @ qd.I(2)),
                qd.expval(0.5 * qd.Z(0) @ qd.Z(1) + 0.2 * qd.Y(0) @ qd.X(1) + 0.3 * qd.X(0)))

    def make():
        f = qd.qnode(qd.device(name, wires=3, **kw), diff_method="backprop")(body)

        def g(v):
            out = f(v)
            out = out if isinstance(out, torch.Tensor) else torch.stack(out)
            return out @ torch.tensor([1.0, -0.7, 0.4], dtype=real)
        return g

    x = torch.tensor([0.4, 0.9], dtype=real)
    a, b = 0.4, 0.9
    # <Z0> = cos a, <Z0 Z1> = cos b, <Y0 X1> = -sin a, <X0> = 0
    value = math.cos(a) - 0.5 * math.cos(b) - 0.08 * math.sin(a)
    g_exact = torch.tensor([-math.sin(a) - 0.08 * math.cos(a), 0.5 * math.sin(b)], dtype=real)
    h_exact = torch.tensor([[-math.cos(a) + 0.08 * math.sin(a), 0.0], [0.0, 0.5 * math.cos(b)]],
                           dtype=real)
    f = make()
    assert torch.allclose(torch.func.hessian(f)(x), h_exact, atol=tol)
    assert torch.allclose(torch.func.jacfwd(f)(x), g_exact, atol=tol)
    assert torch.allclose(torch.func.grad(f)(x), g_exact, atol=tol)
    assert torch.allclose(torch.func.grad(make())(x), g_exact, atol=tol)
    assert torch.allclose(torch.func.hessian(make())(x), h_exact, atol=tol)
    assert abs(float(make()(x)) - value) < tol
    xr = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(xr), xr)
    assert torch.allclose(g, g_exact, atol=tol)
    assert torch.allclose(torch.func.vmap(make())(torch.stack([x, x])),
                          torch.full((2,), value, dtype=real), atol=tol)


def test_z_word_rotation_signs_first_made_inside_a_transform_stay_plain():
    """The sign diagonal a PauliRot on an I/Z word or a MultiRZ makes on first use is kept by
    the gate: made inside a hessian, it still serves the transforms and calls after it."""
    qd.clear_caches()  # the gates' signs are first asked for inside the hessian below
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev, diff_method="backprop")
    def f(v):
        qd.Hadamard(0); qd.Hadamard(1)
        qd.PauliRot(v[0], "ZI", wires=[0, 1]); qd.MultiRZ(v[1], wires=[0, 1])
        return qd.expval(qd.X(0))

    a, b = 0.4, 0.9
    x = torch.tensor([a, b], dtype=torch.float64)
    # <X0> = cos(a) cos(b) on |++>
    h_exact = torch.tensor([[-math.cos(a) * math.cos(b), math.sin(a) * math.sin(b)],
                            [math.sin(a) * math.sin(b), -math.cos(a) * math.cos(b)]],
                           dtype=torch.float64)
    for _ in range(2):
        assert torch.allclose(torch.func.jacfwd(torch.func.jacrev(f))(x), h_exact, atol=1e-10)
    assert torch.allclose(torch.func.jacrev(f)(x), torch.tensor(
        [-math.sin(a) * math.cos(b), -math.cos(a) * math.sin(b)], dtype=torch.float64),
        atol=1e-10)
    assert abs(float(f(x)) - math.cos(a) * math.cos(b)) < 1e-10


@pytest.mark.parametrize("method", ["adjoint", "finite-diff", "spsa"])
def test_second_derivative_raises_instead_of_silent_zero(method):
    """PennyLane returns all-zero Hessians for adjoint (#9901); qdiff raises."""
    q = qd.QNode(lambda w: (qd.RX(w[0], wires=0), qd.RY(w[1], wires=0),
                            qd.expval(qd.Z(0)))[-1], DEV, diff_method=method)
    w = torch.tensor([0.3, 0.4], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(q(w), w, create_graph=True)
    with pytest.raises(qd.QdiffError, match="second derivatives"):
        torch.autograd.grad(g.sum(), w)


def test_parameter_shift_hessian_is_exact_not_zero():
    q = qd.QNode(lambda w: (qd.RX(w[0], wires=0), qd.RY(w[1], wires=0),
                            qd.expval(qd.Z(0)))[-1], DEV, diff_method="parameter-shift")
    w = torch.tensor([0.3, 0.4], dtype=torch.float64, requires_grad=True)
    h = torch.autograd.functional.hessian(q, w)
    a, b = w.detach()
    # f = cos(a) cos(b)
    exact = torch.tensor([[-torch.cos(a) * torch.cos(b), torch.sin(a) * torch.sin(b)],
                          [torch.sin(a) * torch.sin(b), -torch.cos(a) * torch.cos(b)]])
    assert torch.allclose(h, exact.double(), atol=1e-12)


# ------------------------------------------------------------------------------------------
# DistributedDataParallel: two gloo processes; the replicas must stay equal


def _ddp_worker(rank, world, out_dir):
    import datetime
    import torch.distributed as dist
    # a file store: no TCP port to race for on a shared machine; a bounded timeout
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out_dir, 'store')}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, N, dtype=torch.float64),
                                qd.QuantumLayer(circuit, {"weights": (2, N, 3)}))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    gen = torch.Generator().manual_seed(100 + rank)  # different data per rank
    for _ in range(3):
        x = torch.rand(8, 4, dtype=torch.float64, generator=gen)
        opt.zero_grad()
        ddp(x).pow(2).sum().backward()
        opt.step()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    # Leave without running destructors: tearing down DDP's Reducer joins gloo's worker thread
    # while holding the GIL, and that thread may need the GIL to free its last work item (a
    # PyTorch teardown deadlock seen here under load). The results are on disk already.
    os._exit(0)


def test_distributed_data_parallel_replicas_stay_equal(tmp_path):
    import time
    import torch.multiprocessing as mp
    ctx = mp.start_processes(_ddp_worker, args=(2, str(tmp_path)), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 300
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("DDP workers did not finish within 300 s")
    s0 = torch.load(tmp_path / "rank0.pt")
    s1 = torch.load(tmp_path / "rank1.pt")
    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(4, N, dtype=torch.float64),
                               qd.QuantumLayer(circuit, {"weights": (2, N, 3)})).state_dict()
    for k in s0:
        assert torch.allclose(s0[k], s1[k], atol=1e-12), k
    assert any(not torch.allclose(s0[k], init[k]) for k in s0)  # it did train


@pytest.mark.parametrize("method", ["best", "adjoint", "parameter-shift"])
def test_inference_mode_gives_the_no_grad_values(method):
    """Under ``torch.inference_mode`` the trainable weights are read like under ``no_grad``."""
    layer = qd.QuantumLayer(qd.QNode(_body, DEV, diff_method=method),
                            {"weights": (1, N, 3)}, dtype=torch.float64)
    x = torch.rand(4, N, dtype=torch.float64)
    with torch.no_grad():
        ref = layer(x)
    with torch.inference_mode():
        out = layer(x)
    assert not out.requires_grad
    assert torch.allclose(out, ref, atol=1e-12)
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev, diff_method=method)
    def f(a):
        qd.RX(a[0], wires=0)
        qd.RY(a[1], wires=0)
        return qd.expval(qd.Z(0))
    a = torch.tensor([0.3, 0.4], dtype=torch.float64, requires_grad=True)
    with torch.inference_mode():
        val = f(a)
    assert math.isclose(float(val), math.cos(0.3) * math.cos(0.4), abs_tol=1e-12)


@pytest.mark.parametrize("method", ["backprop", "best", "adjoint", "parameter-shift"])
def test_training_after_an_inference_mode_call(method):
    """Constants cached during an inference-mode call (empty caches) serve later backward
    passes: the gradient is the finite-difference one."""
    from qdiff.circuits import caches
    layer = qd.QuantumLayer(qd.QNode(_body, DEV, diff_method=method),
                            {"weights": (1, N, 3)}, dtype=torch.float64)
    x = torch.rand(4, N, dtype=torch.float64)
    caches.clear()
    with torch.inference_mode():
        layer(x)
    layer(x).sum().backward()
    w = layer.weights.detach()
    d = torch.zeros_like(w)
    d[0, 1, 2] = 1e-6
    with torch.no_grad():
        fd = (layer.qnode(x, w + d).sum() - layer.qnode(x, w - d).sum()) / 2e-6
    assert math.isclose(float(layer.weights.grad[0, 1, 2]), float(fd), abs_tol=1e-7)


def test_layer_construction_errors_name_the_argument():
    from qdiff import QdiffError

    def three(inputs, weights, wires):
        return _body(inputs, weights)
    with pytest.raises(QdiffError, match=r"\['wires'\] are neither the input 'inputs' nor"):
        qd.QuantumLayer(qd.QNode(three, DEV), {"weights": (1, N, 3)})
    for bad, words in [((-1, N, 3), "negative size"), ((1.5, N, 3), "must be an int or a tuple"),
                       (None, "must be an int or a tuple"), ("abc", "must be an int or a tuple")]:
        with pytest.raises(QdiffError, match=rf"weight_shapes\['weights'\].*{words}"):
            qd.QuantumLayer(circuit, {"weights": bad})
    with pytest.raises(QdiffError, match="weight_shapes must be a dict"):
        qd.QuantumLayer(circuit, [(1, N, 3)])
    with pytest.raises(QdiffError, match=r"init_method names \['weight'\], which are not"):
        qd.QuantumLayer(circuit, {"weights": (1, N, 3)}, {"weight": torch.nn.init.zeros_})
    with pytest.raises(QdiffError, match="init_method for 'weights' must be a callable or an"):
        qd.QuantumLayer(circuit, {"weights": (1, N, 3)}, "zeros")
    with pytest.raises(QdiffError, match=r"returned shape \(2,\), expected \(1, 3, 3\)"):
        qd.QuantumLayer(circuit, {"weights": (1, N, 3)}, lambda t: torch.zeros(2))
    # an initial value as a nested list is taken like a tensor
    w0 = [[[0.1 * (i + j + k) for k in range(3)] for j in range(N)] for i in range(1)]
    layer = qd.QuantumLayer(circuit, {"weights": (1, N, 3)}, {"weights": w0}, dtype=torch.float64)
    assert torch.equal(layer.weights.detach(), torch.tensor(w0, dtype=torch.float64))


def test_layer_of_mixed_measurements_with_shots_and_counts():
    from qdiff import QdiffError
    dev = qd.device("statevector", wires=2, shots=10, seed=1)

    def make(last):
        @qd.qnode(dev)
        def f(inputs, weights):
            qd.AngleEmbedding(inputs, wires=range(2))
            qd.BasicEntanglerLayers(weights, wires=range(2))
            return [qd.probs(wires=[0]), last()]
        return qd.QuantumLayer(f, {"weights": (1, 2)})
    out = make(lambda: qd.expval(qd.Z(1)))(torch.rand(3, 2))
    assert out.shape == (3, 3)
    assert torch.allclose(out[:, :2].sum(-1), torch.ones(3))
    assert make(lambda: qd.expval(qd.Z(1)))(torch.rand(0, 2)).shape == (0, 3)
    with torch.no_grad(), pytest.raises(QdiffError, match="a qnode output is a list, not a tensor"):
        make(lambda: qd.counts(wires=[1]))(torch.rand(3, 2))


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("method", ["best", "adjoint", "parameter-shift", "finite-diff"])
def test_vectorized_autograd_jacobian_is_refused_clearly(method, static):
    """torch.autograd.functional's vectorize=True (batched cotangents) is a QdiffError naming
    the alternatives, plain and static qnodes alike; torch.func.jacrev and vectorize=False
    give the Jacobian."""
    from qdiff import QdiffError
    q = qd.QNode(_body, DEV, diff_method=method)
    q = qd.jit(q) if static else q
    x = torch.rand(2, N, dtype=torch.float64)
    w = torch.rand(1, N, 3, dtype=torch.float64)
    with pytest.raises(QdiffError, match=r"vectorize=True.*torch\.func\.jacrev"):
        torch.autograd.functional.jacobian(lambda w: q(x, w), w, vectorize=True)
    jac = torch.autograd.functional.jacobian(lambda w: q(x, w), w)
    ref = torch.func.jacrev(lambda w: q(x, w))(w)
    assert torch.allclose(jac, ref, atol=1e-6 if method == "finite-diff" else 1e-12)


@pytest.mark.parametrize("make", ["plain", "static", "qiskit"])
def test_jit_trace_script_and_export_are_refused_by_name(make):
    from qdiff import QdiffError
    if make == "qiskit":
        pytest.importorskip("qiskit")
        from qiskit.circuit.library import real_amplitudes
        ansatz = real_amplitudes(N, reps=1)
        ps = list(ansatz.parameters)
        layer = qd.QuantumLayer.from_qiskit(ansatz, input_params=ps[:N], weight_params=ps[N:])
    else:
        q = qd.qnode(DEV, static=make == "static")(_body)
        layer = qd.QuantumLayer(q, {"weights": (1, N, 3)}, dtype=torch.float64)
    x = torch.rand(2, N, dtype=torch.float64)
    with pytest.raises(QdiffError, match="torch.jit.trace cannot capture a qnode call"):
        torch.jit.trace(layer, x, check_trace=False)
    with pytest.raises(QdiffError, match="torch.jit.script cannot compile a qnode call"):
        torch.jit.script(torch.nn.Sequential(torch.nn.Linear(N, N), layer))
    if make == "plain":
        with pytest.raises(QdiffError, match="torch.export cannot capture a qnode call"):
            torch.export.export(layer, (x,))
    assert layer(x).shape[0] == 2  # eager calls are unaffected


@pytest.mark.parametrize("make", ["plain", "static", "qiskit"])
def test_torch_compile_fullgraph_names_the_eager_qnode_call(make):
    """torch.compile(fullgraph=True), which cannot take the qnode call's graph break, fails
    with a reason that says so (where torch shows one)."""
    import inspect
    if "reason" not in inspect.signature(torch.compiler.disable).parameters:
        pytest.skip("this torch's compiler.disable takes no reason")
    if make == "qiskit":
        pytest.importorskip("qiskit")
        from qiskit.circuit.library import real_amplitudes
        ansatz = real_amplitudes(N, reps=1)
        ps = list(ansatz.parameters)
        layer = qd.QuantumLayer.from_qiskit(ansatz, input_params=ps[:N], weight_params=ps[N:])
    else:
        q = qd.qnode(DEV, static=make == "static")(_body)
        layer = qd.QuantumLayer(q, {"weights": (1, N, 3)}, dtype=torch.float64)
    model = torch.nn.Sequential(torch.nn.Linear(N, N, dtype=torch.float64), layer)
    x = torch.rand(2, N, dtype=torch.float64)
    torch._dynamo.reset()  # (an earlier test's compilation leaves dynamo's caches filled)
    with pytest.raises(Exception, match=r"stays eager under torch\.compile.*fullgraph"):
        torch.compile(model, fullgraph=True)(x)
    torch._dynamo.reset()


def test_init_method_must_set_every_weight():
    """An init_method that fills only part of its tensor, or returns something that is not a
    tensor, is refused (never uninitialised memory as weights); in-place inits that return
    None and ones that return a new tensor work."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(inputs, w):
        qd.AngleEmbedding(inputs, wires=range(2))
        qd.BasicEntanglerLayers(w, wires=range(2))
        return [qd.expval(qd.Z(i)) for i in range(2)]

    def half(t):
        t[0].fill_(0.1)

    def fill(t):
        t.fill_(0.25)
    for bad, match in ((half, "left entries unset"), (lambda t: None, "left entries unset"),
                       (lambda t: 3.0, "returned float")):
        with pytest.raises(qd.QdiffError, match=match):
            qd.QuantumLayer(f, {"w": (2, 2)}, init_method=bad)
    assert torch.equal(qd.QuantumLayer(f, {"w": (2, 2)}, init_method=fill).w.detach(),
                       torch.full((2, 2), 0.25))
    assert torch.equal(qd.QuantumLayer(f, {"w": (2, 2)},
                                       init_method=lambda t: torch.ones(2, 2)).w.detach(),
                       torch.ones(2, 2))


def test_layer_refuses_what_it_cannot_take_by_name():
    """A weight named like a torch module attribute, a complex initial value, something other
    than a qnode, and a qnode returning something other than tensors are QdiffErrors naming
    what is at fault (never a KeyError/TypeError, never a silently dropped imaginary part)."""
    dev = qd.device("statevector", wires=1)

    def make(name):
        ns = {"qd": qd}
        exec(f"def f(inputs, {name}):\n    qd.RX(inputs, wires=0)\n    qd.RY({name}, wires=0)\n"
             "    return qd.expval(qd.Z(0))", ns)
        return qd.qnode(dev)(ns["f"])
    for name in ("training", "forward", "qnode", "qnode_weights"):
        with pytest.raises(qd.QdiffError, match=rf"weight name\(s\) \['{name}'\] are attributes"):
            qd.QuantumLayer(make(name), {name: 1})
    f = make("w")
    with pytest.raises(qd.QdiffError, match="initial value of 'w' is complex"):
        qd.QuantumLayer(f, {"w": 1}, init_method={"w": torch.tensor(1 + 1j)})
    for init in (np.array([0.3 + 0.2j]), [0.3 + 0.2j]):  # numpy and lists as tensors are
        with pytest.raises(qd.QdiffError, match="initial value of 'w' is complex"):
            qd.QuantumLayer(f, {"w": (1,)}, init_method={"w": init})
    layer = qd.QuantumLayer(f, {"w": (1,)}, init_method=[0.1], dtype=torch.float64)
    assert layer.w.dtype == torch.float64 and float(layer.w) == 0.1  # a list kept in float64
    with pytest.raises(qd.QdiffError, match="init_method for 'w' returned a complex tensor"):
        qd.QuantumLayer(f, {"w": 1}, init_method=lambda t: torch.full(t.shape, 1 + 1j))
    with pytest.raises(qd.QdiffError, match="qnode must be a qnode"):
        qd.QuantumLayer(42, {"w": 1})
    layer = qd.QuantumLayer(lambda inputs, w: 0.5, {"w": 1})
    with pytest.raises(qd.QdiffError, match="the qnode returned a float, not a tensor"):
        layer(torch.rand(1))


def test_list_and_array_inputs_keep_their_batch():
    """An input given as a list or a numpy array is the tensor of it: a batch of 2 rows with
    measurements of several shapes gives (2, K), as the tensor does, in the weights' dtype."""
    import numpy as np
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev)
    def f(inputs, w):
        qd.AngleEmbedding(inputs, wires=range(2))
        qd.RY(w, wires=0)
        return [qd.expval(qd.Z(0)), qd.probs(wires=[0, 1])]
    layer = qd.QuantumLayer(f, {"w": 1}, dtype=torch.float64)
    rows = [[0.1, 0.2], [0.3, 0.4]]
    ref = layer(torch.tensor(rows, dtype=torch.float64))
    assert ref.shape == (2, 5)
    for given in (rows, np.array(rows), np.array(rows, dtype=np.float32)):
        out = layer(given)
        assert out.shape == (2, 5) and out.dtype == torch.float64
        assert torch.allclose(out, ref, atol=1e-7)
    for bad in (None, "ab"):
        with pytest.raises(qd.QdiffError, match="inputs must be a tensor or an array"):
            layer(bad)


def test_extra_leading_dims_run_as_rows_as_in_torchlayer():
    """Inputs (A, B, F) reach the qnode as (A*B, F) and the outputs come back (A, B, K), as
    with PennyLane's TorchLayer: a circuit that reads inputs[:, i] gets one row per sample."""
    qml = pytest.importorskip("pennylane")

    def make(lib):
        def f(inputs, w):
            lib.RX(inputs[:, 0], wires=0)
            lib.RY(inputs[:, 1], wires=1)
            lib.CNOT(wires=[0, 1])
            lib.RY(w[0], wires=0)
            lib.RX(w[1], wires=1)
            return [lib.expval(lib.Z(0)), lib.probs(wires=[1])]
        return f
    layer = qd.QuantumLayer(qd.qnode(qd.device("statevector", wires=2))(make(qd)), {"w": 2},
                            dtype=torch.float64)
    ref = qml.qnn.TorchLayer(qml.qnode(qml.device("default.qubit", wires=2),
                                       interface="torch")(make(qml)), {"w": 2})
    ref.load_state_dict(layer.state_dict())
    x = torch.rand(2, 3, 2, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    assert out.shape == (2, 3, 3)
    assert torch.allclose(out, ref(x.double()).to(out.dtype), atol=1e-10)
    (gx,) = torch.autograd.grad(out.sum(), x)
    (gx_ref,) = torch.autograd.grad(layer(x.reshape(6, 2)).sum(), x)
    assert torch.allclose(gx, gx_ref, atol=1e-12)
    assert layer(torch.rand(2, 0, 2, dtype=torch.float64)).shape == (2, 0, 3)


@pytest.mark.parametrize("method", ["best", "backprop", "adjoint", "parameter-shift"])
def test_trainable_float64_observable_widens_float32_angles(method):
    """float32 angles measured with trainable float64 Hamiltonian coefficients give float64
    outputs (as torch promotes float32 * float64) and float64-exact coefficient gradients;
    the angles' gradient stays float32. Plain float64 coefficients keep the float32 output."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev, diff_method=method)
    def f(x, coeffs):
        qd.RX(x, wires=0)
        qd.RY(0.3, wires=1)
        return qd.expval(qd.Hamiltonian(coeffs, [qd.Z(0), qd.X(1)]))

    x = torch.tensor([0.4, 0.5], requires_grad=True)
    coeffs = torch.tensor([1 + 1e-9, 1 / 3], dtype=torch.float64, requires_grad=True)
    out = f(x, coeffs)
    assert out.dtype == torch.float64
    expected = coeffs.detach()[0] * torch.cos(x.detach().double()) + coeffs.detach()[1] * \
        math.sin(0.3)
    torch.testing.assert_close(out.detach(), expected, atol=1e-15, rtol=0)
    out.sum().backward()
    assert x.grad.dtype == torch.float32 and coeffs.grad.dtype == torch.float64
    torch.testing.assert_close(coeffs.grad[1].item(), 2 * math.sin(0.3), atol=1e-15, rtol=0)
    assert f(x, coeffs.detach()).dtype == torch.float32


def test_trainable_float64_state_and_matrix_widen_float32_angles():
    """A trainable float64 state preparation or QubitUnitary matrix widens float32 angles'
    outputs to float64 too (backprop differentiates them)."""
    dev = qd.device("statevector", wires=2)

    @qd.qnode(dev, diff_method="backprop")
    def prep(features, x):
        qd.AmplitudeEmbedding(features, wires=[0, 1], normalize=True)
        qd.RX(x, wires=0)
        return qd.expval(qd.Z(1))

    @qd.qnode(dev)
    def unitary(u, x):
        qd.QubitUnitary(u, wires=0)
        qd.RX(x, wires=1)
        return qd.expval(qd.Z(0))

    x = torch.tensor(0.4, requires_grad=True)
    features = torch.tensor([1.0, 1 / 3, 0.2, 0.1], dtype=torch.float64, requires_grad=True)
    v = features.detach() / features.detach().norm()
    out = prep(features, x)
    assert out.dtype == torch.float64
    assert abs(out.item() - (v[0] ** 2 - v[1] ** 2 + v[2] ** 2 - v[3] ** 2).item()) < 1e-15
    th = torch.tensor(1 / 3, dtype=torch.float64, requires_grad=True)
    c, s = torch.cos(th), torch.sin(th)
    u = torch.stack([torch.stack([c, -s]), torch.stack([s, c])]).to(torch.complex128)
    out = unitary(u, x)
    assert out.dtype == torch.float64 and abs(out.item() - math.cos(2 / 3)) < 1e-15
    out.backward()
    assert x.grad.dtype == torch.float32 and th.grad.dtype == torch.float64


@pytest.mark.parametrize("static", [False, True])
def test_float16_output_overflow_is_refused(static):
    """Outputs of float16 angles are float16: a value past 65504 is a QdiffError naming
    float16, never a silent inf (float32 inputs give the value; bfloat16 holds it)."""
    dev = qd.device("statevector", wires=1)

    def body(inputs, w):
        qd.RX(inputs[..., 0], wires=0)
        qd.RY(w[0], wires=0)
        return [qd.expval(1e5 * qd.Z(0)), qd.expval(qd.Z(0))]

    q = qd.qnode(dev, static=static)(body)
    x = torch.tensor([[0.1]], dtype=torch.float16)
    w = torch.tensor([0.2], dtype=torch.float16)
    with pytest.raises(qd.QdiffError, match="range of float16"):
        q(x, w)
    assert q(torch.tensor([[1.4]], dtype=torch.float16), w).isfinite().all()
    torch.testing.assert_close(q(x.float(), w.float())[0, 0].item(),
                               1e5 * math.cos(x.item()) * math.cos(w.item()), rtol=1e-6, atol=0)
    assert torch.isfinite(q(x.bfloat16(), w.bfloat16())).all()
    layer = qd.QuantumLayer(q, {"w": (1,)}).half()
    with pytest.raises(qd.QdiffError, match="QuantumLayer.*range of float16"):
        layer(x)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("method", ["best", "backprop", "parameter-shift"])
def test_half_precision_inputs_and_weights(method, static):
    """bfloat16 inputs (a Linear under torch.autocast before the layer) and float16 weights
    (``.half()``) reach the qnode in float32, static qnodes included: the outputs are the
    float32 layer's on the same values, in the input's dtype, and gradients reach both."""
    torch.manual_seed(0)
    q = qd.QNode(_body, DEV, diff_method=method)
    q = qd.jit(q) if static else q
    model = torch.nn.Sequential(torch.nn.Linear(4, N), qd.QuantumLayer(q, {"weights": (2, N, 3)}))
    ref = qd.QuantumLayer(qd.QNode(_body, DEV, diff_method="backprop"), {"weights": (2, N, 3)},
                          init_method={"weights": model[1].weights.detach()})
    x = torch.rand(5, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = model[0](x)
        out = model[1](h)
    assert h.dtype == out.dtype == torch.bfloat16
    hr = h.detach().float().requires_grad_()
    expected = ref(hr)
    torch.testing.assert_close(out.float(), expected.to(torch.bfloat16).float())
    g = torch.rand_like(expected)
    (gw,) = torch.autograd.grad(out, model[1].weights, g.to(out.dtype))
    (gwr,) = torch.autograd.grad(expected, ref.weights, g.to(out.dtype).float())
    torch.testing.assert_close(gw, gwr, atol=1e-5, rtol=1e-5)
    layer = model[1].half()
    xh = torch.rand(5, N, dtype=torch.float16, requires_grad=True)
    out = layer(xh)
    ref.weights.data = layer.weights.detach().float()
    xr = xh.detach().float().requires_grad_()
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, ref(xr).half())
    out.sum().backward()
    ref(xr).sum().backward()
    assert layer.weights.grad.dtype == xh.grad.dtype == torch.float16
    torch.testing.assert_close(layer.weights.grad, ref.weights.grad.half(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(xh.grad, xr.grad.half(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("method", ["best", "backprop", "parameter-shift"])
def test_autocast_leaves_the_engine_in_the_device_precision(method, static):
    """Under torch.autocast (bfloat16) a complex64 device's outputs and gradients are those
    computed without it: the engine's float32 products are not run in bfloat16."""
    n = 3
    dev = qd.device("statevector", wires=n, dtype=torch.complex64)

    @qd.qnode(dev, diff_method=method, static=static)
    def circuit(inputs, w):
        qd.AngleEmbedding(inputs, wires=range(n))
        qd.StronglyEntanglingLayers(w, wires=range(n))
        return [qd.expval(qd.Z(0)), qd.expval(0.5 * qd.X(0) @ qd.Z(1) + qd.Y(2)),
                qd.expval(qd.Z(2))]
    torch.manual_seed(0)
    layer = qd.QuantumLayer(circuit, {"w": (2, n, 3)}, dtype=torch.float32)
    x = torch.rand(5, n)
    ref = layer(x)
    (gref,) = torch.autograd.grad(ref.pow(2).sum(), layer.w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    (g,) = torch.autograd.grad(out.pow(2).sum(), layer.w)  # backward outside, as torch advises
    assert out.dtype == torch.float32
    assert torch.allclose(out, ref, atol=1e-6, rtol=0)
    assert torch.allclose(g, gref, atol=1e-6, rtol=0)
    if method != "backprop":  # qdiff's own backward runs in the device's precision anywhere
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (g,) = torch.autograd.grad(layer(x).pow(2).sum(), layer.w)
        assert torch.allclose(g, gref, atol=1e-6, rtol=0)


def test_autocast_probe_reads_a_torch_without_the_device_argument(monkeypatch):
    """torch before 2.4: ``is_autocast_enabled()`` takes no argument and answers for CUDA,
    ``is_autocast_cpu_enabled()`` for the CPU; the probes read those."""
    from qdiff.bridge import autocast_probe

    def is_autocast_enabled(*args):
        if args:
            raise TypeError("is_autocast_enabled() takes 0 positional arguments but 1 was given")
        return "cuda flag"
    monkeypatch.setattr(torch, "is_autocast_enabled", is_autocast_enabled)
    monkeypatch.setattr(torch, "is_autocast_cpu_enabled", lambda: "cpu flag", raising=False)
    assert autocast_probe("cpu")() == "cpu flag"
    assert autocast_probe("cuda")() == "cuda flag"
    monkeypatch.undo()
    assert autocast_probe("cpu")() is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_probe("cpu")() is True


def test_graph_capture_check_runs_on_a_torch_without_is_exporting(monkeypatch):
    """torch before 2.6 has no ``torch.compiler.is_exporting``: the check before each qnode
    call passes eager calls instead of raising AttributeError."""
    from qdiff.bridge import refuse_graph_capture
    monkeypatch.delattr(torch.compiler, "is_exporting")
    assert refuse_graph_capture("qnode", None) is None


def test_init_method_refusing_a_weight_shape_is_named():
    """torch.nn.init functions that need two dimensions (xavier, kaiming) refuse a vector or a
    scalar weight: the error names the weight and its shape."""
    @qd.qnode(qd.device("statevector", wires=1))
    def f(inputs, w, b):
        qd.RX(w[0] + b, 0)
        return qd.expval(qd.Z(0))
    for init in (torch.nn.init.xavier_uniform_, {"w": torch.nn.init.kaiming_normal_}):
        with pytest.raises(qd.QdiffError, match=r"init_method for 'w' cannot initialise a "
                                                r"weight of shape \(3,\): Fan in"):
            qd.QuantumLayer(f, {"w": 3, "b": 1}, init_method=init)
    layer = qd.QuantumLayer(f, {"w": 3, "b": 1}, init_method={"w": torch.nn.init.zeros_,
                                                                "b": torch.nn.init.ones_})
    assert float(layer.b) == 1.0 and not layer.w.detach().any()


def test_quantum_layer_refuses_an_unknown_keyword_by_name():
    dev = qd.device("statevector", wires=1)

    @qd.qnode(dev)
    def f(inputs, w):
        qd.RX(w, 0)
        return qd.expval(qd.Z(0))
    with pytest.raises(qd.QdiffError, match=r"QuantumLayer: .*'foo' \(its arguments: qnode, "
                                            r"weight_shapes, init_method, dtype\)"):
        qd.QuantumLayer(f, {"w": ()}, foo=1)


def test_layer_feeds_weights_through_the_qnodes_kwargs_as_pennylane():
    """PennyLane's TorchLayer passes weights by name, so a qnode may take them as **kwargs."""
    qml = pytest.importorskip("pennylane")
    n = 2
    w0 = torch.rand(1, n, dtype=torch.float64)
    x = torch.rand(3, n, dtype=torch.float64)

    @qd.qnode(qd.device("statevector", wires=n))
    def ours(inputs, **kw):
        qd.AngleEmbedding(inputs, wires=range(n))
        qd.BasicEntanglerLayers(kw["w"], wires=range(n))
        return qd.expval(qd.Z(0))

    @qml.qnode(qml.device("default.qubit", wires=n), interface="torch")
    def theirs(inputs, **kw):
        qml.AngleEmbedding(inputs, wires=range(n))
        qml.BasicEntanglerLayers(kw["w"], wires=range(n))
        return qml.expval(qml.Z(0))

    layer = qd.QuantumLayer(ours, {"w": (1, n)}, init_method={"w": w0}, dtype=torch.float64)
    ref = qml.qnn.TorchLayer(theirs, {"w": (1, n)}, init_method={"w": lambda t: w0.clone()})
    assert torch.allclose(layer(x), ref.double()(x), atol=1e-12)
    layer(x).sum().backward()
    assert layer.w.grad is not None and layer.w.grad.shape == (1, n)


def test_meta_devices_and_meta_inputs_are_refused_by_name():
    with pytest.raises(qd.QdiffError, match="meta tensors hold no values"):
        qd.device("statevector", wires=1, device="meta")
    layer = qd.QuantumLayer(circuit, {"weights": (2, N, 3)}, dtype=torch.float64).to("meta")
    with pytest.raises(qd.QdiffError, match="'meta' device hold no values"):
        layer(torch.zeros(2, N, dtype=torch.float64, device="meta"))


def test_jit_names_an_unknown_keyword():
    with pytest.raises(qd.QdiffError, match="jit: got an unexpected keyword argument "
                                            "'diff_method'.*qnode, max_traces"):
        qd.jit(circuit, diff_method="adjoint")


SHOT_DEV = qd.device("statevector", wires=N, shots=100)


@qd.qnode(SHOT_DEV)
def shot_circuit(inputs, weights):
    return _body(inputs, weights)


class _ShotRows(torch.utils.data.Dataset):
    """Each item runs the same sampled circuit (same input, same weights)."""

    def __init__(self, weights):
        self.weights = weights

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return shot_circuit(torch.full((N,), 0.5, dtype=torch.float64), self.weights)


def test_unseeded_shots_follow_torchs_global_generator():
    """Without a device seed, shots (and SPSA directions) are drawn from torch's global
    generator: torch.manual_seed repeats them, another seed changes them."""
    layer = qd.QuantumLayer(shot_circuit, {"weights": (2, N, 3)}, dtype=torch.float64)
    x = torch.rand(6, N, dtype=torch.float64)

    def run(seed):
        torch.manual_seed(seed)
        return layer(x).detach()
    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    spsa = qd.QNode(_body, DEV, diff_method="spsa")
    w = torch.rand(2, N, 3, dtype=torch.float64, requires_grad=True)

    def grad(seed):
        torch.manual_seed(seed)
        return torch.autograd.grad(spsa(x, w).sum(), w)[0]
    assert torch.equal(grad(5), grad(5)) and not torch.equal(grad(5), grad(6))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_dataloader_fork_workers_draw_different_shots():
    """DataLoader workers forked after the parent sampled draw apart (torch reseeds each
    worker's global generator), instead of repeating one inherited stream."""
    weights = torch.rand(2, N, 3, dtype=torch.float64)
    shot_circuit(torch.zeros(N, dtype=torch.float64), weights)  # the parent draws first
    loader = torch.utils.data.DataLoader(_ShotRows(weights), batch_size=2, num_workers=2,
                                         multiprocessing_context="fork", timeout=120)
    first, second = list(loader)
    assert not torch.equal(first, second)
