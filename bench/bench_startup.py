"""Start-up and small-compile latency, each against its baseline in the same run.

    python bench/bench_startup.py [--repeat 5] [--dir ../shared/benchmarks/qasm]

Every command runs in a fresh interpreter; the rows are interleaved (one round runs each
command once) and each figure is the median over the rounds. Baselines: ``import torch`` for
``import qdiff``; nothing for ``qdiff --help``/``--version`` (they must stay under 0.3 s);
``python -c "import torch, qiskit"`` for the compiles (-O1 on a small file; -O3 on every
circuit of the set with at most 4 qubits and 50 CX).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "..", "..", "shared", "benchmarks", "qasm")
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


def measure(cmds: dict, repeat: int) -> dict:
    times: dict = {k: [] for k in cmds}
    for _ in range(repeat):
        for k, cmd in cmds.items():
            t = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=DEFAULT_DIR)
    args = ap.parse_args(argv)
    m = measure(commands(args.dir), args.repeat)
    base = m["import torch, qiskit"]
    rows = [("import qdiff", m["import qdiff"], m["import qdiff"] - m["import torch"],
             "import torch", 0.5),
            ("qdiff --help", m["qdiff --help"], m["qdiff --help"], "-", 0.3),
            ("qdiff --version", m["qdiff --version"], m["qdiff --version"], "-", 0.3),
            ("qdiff compile -O1 qft_n4", m["-O1 qft_n4"], m["-O1 qft_n4"] - base,
             "import torch, qiskit", 1.0)]
    for name in SMALL:
        rows.append((f"qdiff compile -O3 {name}", m[f"-O3 {name}"], m[f"-O3 {name}"] - base,
                     "import torch, qiskit", 2.0))
    print(f"baselines (median of {args.repeat}): import torch {m['import torch']:.2f} s, "
          f"import torch, qiskit {base:.2f} s")
    print("| command | median s | over baseline s | baseline | goal s |")
    print("|---|---|---|---|---|")
    for name, t, over, b, goal in rows:
        mark = "" if over <= goal else " (over)"
        print(f"| `{name}` | {t:.2f} | {over:+.2f}{mark} | {b} | <= {goal} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
