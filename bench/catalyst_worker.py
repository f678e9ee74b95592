"""PennyLane Catalyst side of ``bench/bench_training.py --catalyst PYTHON``.

Runs under another Python environment (Catalyst needs JAX), driven over stdin/stdout one JSON
line per request like ``bench/tq_worker.py``:

* ``{"cmd": "setup", "shape", "n", "b", "threads"}``: the model of ``bench_training.py``'s
  shape in JAX (float64) with the quantum layer as a ``lightning.qubit`` qnode
  (``diff_method="adjoint"``: AngleEmbedding + StronglyEntanglingLayers(3), expval Z on every
  wire), one qnode call per sample (the batch loop unrolled), Adam; compiles the step and
  answers ``{"compile": seconds}`` (wall time of the first step, compilation included).
  ``first``: the whole step (loss, ``catalyst.grad``, Adam) is one ``qml.qjit`` program.
  ``hybrid``: ``qml.qjit`` compiles the gradient of everything from the first Linear layer's
  output on (quantum layer, second Linear, loss; ``catalyst.grad``), ``jax.jit`` the first
  Linear layer and Adam: Catalyst 0.15's compiler aborts (an Enzyme assertion) when the
  embedding angles are computed inside the differentiated program, or when an argument that
  feeds a gate is left out of the differentiation, so the gradient is taken with respect to
  every argument that reaches a gate;
* ``{"cmd": "step"}``: one training step; answers ``{"cpu": seconds}`` (process CPU time);
* ``{"cmd": "layer", "x": [[...]], "w": [...]}``: the quantum layer's outputs (the qnode run
  by PennyLane without compilation) for inputs ``x`` (B, n) and weights ``w`` (3, n, 3).
"""
from __future__ import annotations

import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")


def build(shape, n, b):
    import jax
    import jax.numpy as jnp
    import pennylane as qml
    import catalyst

    dev = qml.device("lightning.qubit", wires=n)

    @qml.qnode(dev, diff_method="adjoint")
    def circuit(inputs, weights):
        qml.AngleEmbedding(inputs, wires=range(n))
        qml.StronglyEntanglingLayers(weights, wires=range(n))
        return [qml.expval(qml.PauliZ(i)) for i in range(n)]

    def qlayer(h, w):
        return jnp.stack([jnp.stack(circuit(h[i], w)) for i in range(b)])

    def adam(p, m, v, t, g):
        b1, b2, lr, eps = 0.9, 0.999, 0.01, 1e-8
        t = t + 1
        m = jax.tree_util.tree_map(lambda a, c: b1 * a + (1 - b1) * c, m, g)
        v = jax.tree_util.tree_map(lambda a, c: b2 * a + (1 - b2) * c * c, v, g)
        p = jax.tree_util.tree_map(
            lambda a, mm, vv: a - lr * (mm / (1 - b1 ** t)) / (jnp.sqrt(vv / (1 - b2 ** t)) + eps),
            p, m, v)
        return p, m, v, t

    k = jax.random.split(jax.random.PRNGKey(0), 6)
    if shape == "first":
        p = {"w": jax.random.uniform(k[0], (3, n, 3)) * 6,
             "W2": jax.random.uniform(k[1], (1, n)) - 0.5, "b2": jnp.zeros(1)}
        x = jax.random.uniform(k[3], (b, n))
        y = jax.random.uniform(k[4], (b,))

        def loss(p, x, y):
            out = qlayer(x, p["w"]) @ p["W2"].T + p["b2"]
            return jnp.mean((out[:, 0] - y) ** 2)

        @qml.qjit
        def step(p, m, v, t, x, y):
            g = catalyst.grad(loss, argnums=(0, 1))(p, x, y)[0]
            return adam(p, m, v, t, g)
    else:
        p = {"w": jax.random.uniform(k[0], (3, n, 3)) * 6,
             "W1": jax.random.uniform(k[1], (n, 16)) - 0.5, "b1": jnp.zeros(n),
             "W2": jax.random.uniform(k[2], (2, n)) - 0.5, "b2": jnp.zeros(2)}
        x = jax.random.uniform(k[3], (b, 16))
        y = jax.nn.one_hot(jax.random.randint(k[4], (b,), 0, 2), 2)

        def tail(h, w, W2, b2, y):
            out = qlayer(h, w) @ W2.T + b2
            return jnp.mean(jax.nn.logsumexp(out, axis=1) - jnp.sum(out * y, axis=1))

        @qml.qjit
        def tail_grad(h, w, W2, b2, y):
            return catalyst.grad(tail, argnums=(0, 1, 2, 3))(h, w, W2, b2, y)

        head = jax.jit(lambda W1, b1, x: x @ W1.T + b1)

        @jax.jit
        def finish(p, m, v, t, x, dh, dw, dW2, db2):
            g = {"w": dw, "W1": dh.T @ x, "b1": dh.sum(0), "W2": dW2, "b2": db2}
            return adam(p, m, v, t, g)

        def step(p, m, v, t, x, y):
            dh, dw, dW2, db2 = tail_grad(head(p["W1"], p["b1"], x), p["w"], p["W2"], p["b2"], y)
            return finish(p, m, v, t, x, dh, dw, dW2, db2)

    zeros = jax.tree_util.tree_map(jnp.zeros_like, p)
    state = [p, zeros, zeros, 0.0]

    def run():
        state[:] = step(*state, x, y)
        jax.block_until_ready(state[0])

    return circuit, run


def main():
    from peer_worker import serve
    state = {}

    def setup(req):  # imports here: a missing package is answered as this request's error
        import jax
        import catalyst
        jax.config.update("jax_enable_x64", True)
        state["circuit"], state["step"] = build(req["shape"], int(req["n"]), int(req["b"]))
        t0 = time.perf_counter()
        state["step"]()
        return {"compile": time.perf_counter() - t0, "version": catalyst.__version__}

    def step(req):
        t0 = time.process_time()
        state["step"]()
        return {"cpu": time.process_time() - t0}

    def layer(req):
        import jax.numpy as jnp
        w = jnp.array(req["w"])
        return {"out": [[float(v) for v in state["circuit"](jnp.array(row), w)]
                        for row in req["x"]]}

    serve({"setup": setup, "step": step, "layer": layer})


if __name__ == "__main__":
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                          f"intra_op_parallelism_threads={threads}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
