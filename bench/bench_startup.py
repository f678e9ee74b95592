"""Start-up and small-compile latency, each against its baseline in the same run.

    python bench/bench_startup.py [--repeat 5] [--dir ../shared/benchmarks/qasm]

Every command runs in a fresh interpreter; the rows are interleaved (one round runs each
command once) and each figure is the median over the rounds, of wall time and of CPU time
(user + system of the child): on a shared, loaded machine wall times of every row, baselines
included, stretch with the load, while CPU times move much less, so both are printed. Baselines: ``import torch`` for
``import qdiff``; nothing for ``qdiff --help``/``--version`` (they must stay under 0.3 s);
``python -c "import torch, qiskit"`` for the compiles (-O1 on a small file; -O3 on every
circuit of the set with at most 4 qubits and 50 CX).
"""
from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "..", "..", "shared", "benchmarks", "qasm")
sys.path.insert(0, HERE)
from benchutil import ArgumentParser, circuit_files  # noqa: E402

SMALL = ["qasmbench_adder_n4", "qasmbench_fredkin_n3", "qasmbench_qft_n4", "qasmbench_toffoli_n3",
         "qasmbench_variational_n4", "qasmbench_vqe_n4", "qasmbench_wstate_n3"]


def _qdiff() -> list:
    exe = shutil.which("qdiff")
    return [exe] if exe else [sys.executable, "-m", "qdiff.cli"]


def commands(qasm_dir: str) -> dict:
    py = sys.executable
    cmds = {"import torch": [py, "-c", "import torch"],
            "import qdiff": [py, "-c", "import qdiff"],
            "import torch, qiskit": [py, "-c", "import torch, qiskit"],
            "qdiff --help": _qdiff() + ["--help"],
            "qdiff --version": _qdiff() + ["--version"],
            "-O1 qft_n4": _qdiff() + ["compile", os.path.join(qasm_dir, "qasmbench_qft_n4.qasm"),
                                      "-O", "1", "-o", os.devnull]}
    for name in SMALL:
        cmds[f"-O3 {name}"] = _qdiff() + ["compile", os.path.join(qasm_dir, name + ".qasm"),
                                          "-O", "3", "-o", os.devnull]
    return cmds


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(cmds: dict, repeat: int) -> tuple:
    """``(wall, cpu)``: per command the median wall and CPU seconds over ``repeat`` rounds."""
    wall: dict = {k: [] for k in cmds}
    cpu: dict = {k: [] for k in cmds}
    for _ in range(repeat):
        for k, cmd in cmds.items():
            c, t = _cpu(), time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                last = (done.stderr.strip().splitlines() or [""])[-1]
                sys.exit(f"bench_startup.py: `{k}` failed (exit status {done.returncode}): "
                         f"{last}")
            wall[k].append(time.perf_counter() - t)
            cpu[k].append(_cpu() - c)
    med = statistics.median
    return {k: med(v) for k, v in wall.items()}, {k: med(v) for k, v in cpu.items()}


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=DEFAULT_DIR)
    args = ap.parse_args(argv)
    circuit_files(ap, args.dir, SMALL)
    wall, cpu = measure(commands(args.dir), args.repeat)
    rows = [("import qdiff", "import qdiff", "import torch", 0.5),
            ("qdiff --help", "qdiff --help", None, 0.3),
            ("qdiff --version", "qdiff --version", None, 0.3),
            ("qdiff compile -O1 qft_n4", "-O1 qft_n4", "import torch, qiskit", 1.0)]
    rows += [(f"qdiff compile -O3 {n}", f"-O3 {n}", "import torch, qiskit", 2.0) for n in SMALL]
    print(f"load average {os.getloadavg()[0]:.1f}; baselines (median of {args.repeat}, wall / "
          f"CPU s): import torch {wall['import torch']:.2f} / {cpu['import torch']:.2f}, "
          f"import torch, qiskit {wall['import torch, qiskit']:.2f} / "
          f"{cpu['import torch, qiskit']:.2f}")
    print("| command | wall s | over baseline | CPU s | over baseline | baseline | goal s |")
    print("|---|---|---|---|---|---|---|")
    for label, key, base, goal in rows:
        ow = wall[key] - (wall[base] if base else 0.0)
        oc = cpu[key] - (cpu[base] if base else 0.0)
        mark = lambda x: "" if x <= goal else " (over)"  # noqa: E731
        print(f"| `{label}` | {wall[key]:.2f} | {ow:+.2f}{mark(ow)} | {cpu[key]:.2f} | "
              f"{oc:+.2f}{mark(oc)} | {base or '-'} | <= {goal} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
