"""The benchmark scripts in ``bench/`` as someone re-measuring runs them: usage errors are one
line (exit status 2), a peer that is not installed is named in the output, resumed result files
are not mixed across settings, and a figure is never labelled with what was not measured.

Each case runs a script in a fresh interpreter at its smallest size."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
QASM = os.path.normpath(os.path.join(ROOT, "..", "shared", "benchmarks", "qasm"))
SCRIPTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(BENCH, "bench_*.py"))) + [
    "handoff.py"]
NAM3 = os.path.join(QASM, "nam_barenco_tof_3.qasm")

# makes the modules named in $BLOCK unimportable, as if they were not installed
BLOCKER = """
import os, sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in os.environ["BLOCK"].split(",")):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Blocker())
"""


def run(script, *args, block=None, tmp_path=None, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    if block:
        (tmp_path / "sitecustomize.py").write_text(BLOCKER)
        env.update(BLOCK=block, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    return subprocess.run([sys.executable, os.path.join(BENCH, script), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unknown_option_is_one_line_and_exit_status_2(script):
    r = run(script, "--no-such-option")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "--no-such-option" in r.stderr


def test_an_unknown_peer_name_is_a_usage_error():
    r = run("bench_noise.py", "--peers", "pennylane,aerr")
    assert r.returncode == 2 and "aerr" in r.stderr and r.stderr.count("\n") == 1


def test_a_missing_peer_is_named_and_the_run_goes_on(tmp_path):
    r = run("bench_gradients.py", "--sizes", "2", "--layers", "1", "--reps", "1",
            block="pennylane_lightning", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "lightning.qubit unavailable" in r.stdout and "pennylane_lightning" in r.stdout


def test_a_missing_reference_peer_stops_with_one_line(tmp_path):
    r = run("bench_vqe.py", "--molecules", "H2", block="pennylane_lightning",
            tmp_path=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "lightning.qubit" in r.stderr


@pytest.mark.skipif(not os.path.exists(NAM3), reason=f"benchmark set not found at {QASM}")
@pytest.mark.parametrize("script", ["bench_compile.py", "bench_approx.py", "bench_clifford_t.py"])
def test_a_circuit_name_that_matches_no_file_is_a_usage_error(script):
    r = run(script, "--only", "nam_barenco_tof_3", "no_such_circuit")
    assert r.returncode == 2 and "no_such_circuit" in r.stderr, r.stderr


@pytest.mark.parametrize("script", ["bench_compile.py", "bench_approx.py", "bench_clifford_t.py",
                                    "bench_startup.py"])
def test_a_folder_without_circuits_is_a_usage_error(script, tmp_path):
    r = run(script, "--dir", str(tmp_path))
    assert r.returncode == 2 and str(tmp_path) in r.stderr, r.stderr


@pytest.mark.skipif(not os.path.exists(NAM3), reason=f"benchmark set not found at {QASM}")
def test_compile_results_of_another_level_are_not_resumed(tmp_path):
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps({"meta": {"level": 3, "approx": 1e-6},
                                 "rows": [{"name": "other"}]}))
    r = run("bench_compile.py", "--json", str(saved), "--level", "1", "--only",
            "nam_barenco_tof_3")
    assert r.returncode == 2 and "level" in r.stderr, r.stderr
    assert json.loads(saved.read_text())["rows"] == [{"name": "other"}]


@pytest.mark.skipif(not os.path.exists(NAM3), reason=f"benchmark set not found at {QASM}")
def test_clifford_t_resume_runs_a_circuit_again_for_a_level_it_lacks(tmp_path):
    saved = tmp_path / "r.json"
    r = run("bench_clifford_t.py", "--json", str(saved), "--levels", "1", "--only",
            "nam_barenco_tof_3")
    assert r.returncode == 0, r.stderr
    r = run("bench_clifford_t.py", "--json", str(saved), "--levels", "1", "2", "--only",
            "nam_barenco_tof_3")
    assert r.returncode == 0, r.stderr
    row, = json.loads(saved.read_text())["rows"]
    assert "1" in row and "2" in row
    assert "1/1 complete" in r.stdout


def test_vqe_does_not_report_a_time_to_chemical_accuracy_it_did_not_reach(tmp_path):
    pytest.importorskip("pennylane_lightning")
    r = run("bench_vqe.py", "--molecules", "H2", "--reps", "1", "--max-steps", "2")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| H2 |")]
    assert len(rows) == 3
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[5].startswith("not reached"), line
        assert cells[7] == "-", line
