"""The example scripts in reduced mode (few steps: the energy must fall and stay above the exact
energy), H2 to chemical accuracy, the chemistry set-up (exact sector energies against dense
diagonalization, HF errors of the presets), and the long runs (marked slow)."""
from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest
import torch

import qdiff as qd

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def load(name):
    """Import an example script as the scripts import each other (examples/ on sys.path)."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def common():
    return load("_vqe_common")


def run(name, argv):
    lines = []
    res = load(name).main(argv, log=lambda *a: lines.append(" ".join(str(x) for x in a)))
    return res, "\n".join(lines)


def assert_falls(res):
    e = res.energies
    assert len(e) >= 2
    assert e[-1] < e[0] - 1e-6, e
    assert min(e) >= res.exact - 1e-8  # variational bound on an exact backend


# ------------------------------------------------------------------------------------------
# chemistry set-up


def dense_sector_ground(H, n, mask):
    m = H.matrix(list(range(n))).numpy()
    idx = np.flatnonzero(mask.numpy())
    return float(np.linalg.eigvalsh(m[np.ix_(idx, idx)])[0]), float(np.linalg.eigvalsh(m)[0])


def test_sector_mask_counts(common):
    """N electrons with Sz = 0 in n spin orbitals: C(n/2, N/2)**2 states."""
    from math import comb
    for n, ne in [(4, 2), (8, 4), (10, 2)]:
        assert int(common.sector_mask(n, ne).sum()) == comb(n // 2, ne // 2) ** 2


def test_h2_problem_against_dense(common):
    prob = common.molecular_problem("H2")
    sector, full = dense_sector_ground(prob.hamiltonian, 4, common.sector_mask(4, 2))
    assert abs(prob.exact - sector) < 1e-9
    assert abs(prob.exact - full) < 1e-9  # the H2 ground state is the 2-electron singlet
    assert prob.hf_energy - prob.exact >= 10e-3  # HF misses by >= 10 mHa: the test is real


@pytest.mark.slow
@pytest.mark.parametrize("name,n_params", [("LiH", 24), ("BeH2", 92)])
def test_presets_hf_error_and_sector(common, name, n_params):
    prob = common.molecular_problem(name)
    assert prob.hf_energy - prob.exact >= 10e-3
    op = qd.PauliSumOperator.from_observable(prob.hamiltonian, n_qubits=prob.n_qubits)
    e_sector, psi, _ = qd.ground_state(op, mask=common.sector_mask(prob.n_qubits, prob.electrons))
    assert abs(float(op.expval(psi)) - prob.exact) < 1e-9
    s, d = qd.excitations(prob.electrons, prob.n_qubits)
    assert len(s) + len(d) == n_params


# ------------------------------------------------------------------------------------------
# reduced runs (fast)


def test_vqe_h2_reaches_chemical_accuracy(tmp_path):
    png = tmp_path / "h2.png"
    res, out = run("vqe_h2", ["--steps", "40", "--plot", str(png)])
    assert res.reached is not None and res.error <= 1.6e-3
    assert res.error >= -1e-9
    assert png.stat().st_size > 1000
    for key in ("energy", "exact energy", "error (mHa)", "steps", "wall time", "backend"):
        assert key in out


@pytest.mark.parametrize("extra", [["--optimizer", "adam", "--diff-method", "adjoint"],
                                   ["--ansatz", "hea", "--layers", "2"],
                                   ["--optimizer", "qng", "--lr", "0.3"]])
def test_vqe_h2_variants_energy_falls(extra):
    if "qng" in extra:
        pytest.importorskip("qdiff.metric")
    res, _ = run("vqe_h2", ["--steps", "3", "--run-all"] + extra)
    assert_falls(res)


def test_vqe_h2_with_shots_reports_exact_error():
    """Statevector with shots (parameter-shift): runs every step; the final parameters are
    also evaluated exactly, and that energy is variational."""
    res, out = run("vqe_h2", ["--shots", "4000", "--steps", "4"])
    assert res.steps == 4
    assert "parameter-shift" in res.backend
    assert res.final_exact_energy >= res.exact - 1e-9
    assert res.final_exact_energy < res.energies[0] - 1e-3  # well below HF
    assert "error of final params, exact" in out


def test_spin_chain_reduced(tmp_path):
    res, out = run("vqe_spin_chain", ["--spins", "4", "--steps", "5", "--run-all", "--lr", "0.02",
                                      "--plot", str(tmp_path / "chain.png")])
    assert len(res) == 2
    for r in res:
        assert_falls(r)
    assert (tmp_path / "chain_tfim.png").exists() and (tmp_path / "chain_heisenberg.png").exists()


@pytest.mark.parametrize("model,n", [("tfim", 6), ("heisenberg", 6)])
def test_spin_chain_hamiltonians_against_dense(model, n):
    mod = load("vqe_spin_chain")
    prob = mod.chain_problem(model, n)
    full = float(np.linalg.eigvalsh(prob.hamiltonian.matrix(list(range(n))).numpy())[0])
    assert abs(prob.exact - full) < 1e-9



def test_spin_chain_hamiltonians_closed_forms():
    """Two sites: the Heisenberg pair's singlet at -3 J; TFIM -J ZZ - h (X + X) at
    -sqrt(J^2 + 4 h^2)."""
    mod = load("vqe_spin_chain")
    e = np.linalg.eigvalsh(mod.heisenberg_hamiltonian(2).matrix([0, 1]).numpy())
    assert abs(e[0] + 3.0) < 1e-12 and np.allclose(e[1:], 1.0)
    e = np.linalg.eigvalsh(mod.tfim_hamiltonian(2, 1.0, 0.7).matrix([0, 1]).numpy())
    assert abs(e[0] + np.sqrt(1 + 4 * 0.7 ** 2)) < 1e-12


def test_bond_dissociation_reduced(tmp_path):
    png = tmp_path / "curve.png"
    rows, out = run("bond_dissociation", ["--points", "2", "--rmin", "0.7", "--rmax", "1.5",
                                          "--plot", str(png)])
    assert len(rows) == 2
    for r in rows:
        assert r["reached"] and 0 <= r["error"] <= 1e-4 + 1e-12
        assert r["hf"] - r["exact"] > 10e-3
    assert png.stat().st_size > 1000


def test_hybrid_classifier_reduced(tmp_path):
    png = tmp_path / "boundary.png"
    (acc, history), out = run("hybrid_classifier", ["--epochs", "3", "--train", "64",
                                                    "--test", "64", "--qubits", "2",
                                                    "--layers", "2", "--plot", str(png)])
    losses = [h[0] for h in history]
    assert losses[-1] < losses[0]
    assert 0.0 <= acc <= 1.0 and "test accuracy" in out
    assert png.stat().st_size > 1000


# ------------------------------------------------------------------------------------------
# long runs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vqe_lih", "vqe_beh2"])
def test_molecules_reach_chemical_accuracy(name):
    res, _ = run(name, ["--every", "50"])
    assert res.reached is not None and -1e-9 <= res.error <= 1.6e-3


@pytest.mark.slow
def test_spin_chains_reach_relative_target():
    res, _ = run("vqe_spin_chain", ["--spins", "8", "--every", "500"])
    for r in res:
        assert r.reached is not None and 0 <= r.error <= 1e-3 * abs(r.exact)


@pytest.mark.slow
def test_hybrid_classifier_learns():
    (acc, _), _ = run("hybrid_classifier", [])
    assert acc >= 0.95


def test_device_default_shots_count_as_noisy_and_exact_aer_stops_at_the_target(common,
                                                                                 monkeypatch):
    """An IBM device samples with its own default shots when --shots is not given: the run
    takes every step and a noisy estimate within the target is labelled as one, not as
    chemical accuracy reached. Aer without --shots is exact and stops at the target."""
    pytest.importorskip("qiskit_aer")

    def sampled(args, n):  # a device with default shots, as qd.device("ibm", ...) has
        return qd.device("statevector", wires=n, shots=20000, seed=0), "parameter-shift", \
            "ibm fake (20000 shots)"

    with monkeypatch.context() as m:
        m.setattr(common, "make_device", sampled)
        res, out = run("vqe_h2", ["--backend", "ibm:fake_manila", "--steps", "6"])
    assert res.noisy and res.steps == 6
    assert "(first noisy estimate)" in out and "(first reached)" not in out
    res, out = run("vqe_h2", ["--backend", "aer", "--steps", "40"])
    assert not res.noisy and res.reached == res.steps < 40
    assert abs(res.error) <= 1.6e-3 and "(first reached)" not in out


@pytest.mark.slow
def test_vqe_h2_on_aer_with_shots():
    pytest.importorskip("qiskit_aer")
    res, out = run("vqe_h2", ["--backend", "aer", "--shots", "10000", "--steps", "4"])
    assert "aer" in res.backend and res.steps == 4
    assert res.final_exact_energy < res.energies[0] - 5e-3  # parameters improved on HF


@pytest.mark.slow
def test_vqe_h2_on_fake_manila():
    pytest.importorskip("qiskit_ibm_runtime")
    res, out = run("vqe_h2", ["--backend", "ibm:fake_manila", "--steps", "2"])
    assert "fake_manila" in res.backend and res.steps == 2
    assert res.final_exact_energy < res.energies[0]  # noisy energies, but the step helps


def test_noise_aware_vqe_reduced(tmp_path):
    """Two steps: the noisy energy falls, stays above the exact energy, and Aer's
    density-matrix estimate with the device's own noise model equals the mixed engine's."""
    pytest.importorskip("qiskit_aer")
    pytest.importorskip("qiskit_ibm_runtime")
    png = tmp_path / "noise.png"
    res, out = run("noise_aware_vqe", ["--steps", "2", "--aer-every", "1", "--layers", "1",
                                       "--plot", str(png)])
    assert_falls(res)
    assert all(abs(a - res.aware[s]) < 1e-8 for s, a in res.aer)
    # noise costs energy: the noisy energy of the same parameters is above the noiseless one
    assert res.naive_noisy[0] > res.naive_ideal[0] + 1e-3
    assert png.stat().st_size > 1000
    assert "Aer vs mixed engine" in out


def test_noise_aware_vqe_lih_reduced(tmp_path):
    """LiH in 2 electrons / 2 orbitals on fake_manila's noise, two steps of both molecules: the
    noisy energy falls and stays above the exact sector energy (itself below HF), Aer's
    density-matrix estimate equals the mixed engine's (relative 1e-8: Aer's density matrix
    loses about 1e-9 of trace per few gates, times LiH's -7.5 Ha constant term), and
    ``--molecule both`` writes one plot per molecule."""
    pytest.importorskip("qiskit_aer")
    pytest.importorskip("qiskit_ibm_runtime")
    res, out = run("noise_aware_vqe", ["--molecule", "both", "--steps", "2", "--aer-every", "1",
                                       "--layers", "1", "--plot",
                                       str(tmp_path / "noise_{molecule}.png")])
    assert set(res) == {"H2", "LiH"}
    lih = res["LiH"]
    assert_falls(lih)
    assert lih.exact < lih.hf - 1e-4 and min(lih.aware + lih.naive_noisy) > lih.exact
    assert all(abs(a - lih.aware[s]) < 1e-8 * abs(a) for s, a in lih.aer)
    assert lih.naive_noisy[0] > lih.naive_ideal[0] + 1e-3
    p = np.linalg.eigvalsh(qd.qchem.molecule("LiH", active_electrons=2, active_orbitals=2)
                           .hamiltonian.matrix([0, 1, 2, 3]).numpy())
    assert p[0] <= lih.exact + 1e-12   # the sector ground energy, not below the spectrum
    for name in ("h2", "lih"):
        assert (tmp_path / f"noise_{name}.png").stat().st_size > 1000
    assert "LiH final noisy energy" in out
    with pytest.raises(SystemExit):
        run("noise_aware_vqe", ["--molecule", "both", "--steps", "1", "--plot", "x.png"])


# ------------------------------------------------------------------------------------------
# command line: bad values are one line on stderr and exit code 2


def test_bad_option_from_the_shell_is_one_line_and_exit_2():
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.path.dirname(EXAMPLES) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "vqe_h2.py"), "--every", "0"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--every" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("name,argv,what", [
    ("vqe_h2", ["--steps", "-1"], "--steps"),
    ("vqe_h2", ["--every", "0"], "--every"),
    ("vqe_h2", ["--threads", "-1"], "--threads"),
    ("vqe_h2", ["--threads", "100000"], "CPU count"),
    ("hybrid_classifier", ["--threads", "100000"], "CPU count"),
    ("vqe_h2", ["--shots", "0"], "--shots"),
    ("vqe_h2", ["--lr", "nan"], "--lr"),
    ("vqe_h2", ["--ansatz", "hea", "--layers", "0"], "--layers"),
    ("vqe_h2", ["--ansatz", "hva"], "--ansatz hva"),
    ("vqe_h2", ["--layers", "2"], "--layers"),
    ("vqe_h2", ["--backend", "foo"], "--backend"),
    ("vqe_h2", ["--device", "cuda", "--backend", "aer"], "--device cuda"),
    ("vqe_h2", ["--plot", "nodir/x.png"], "no folder"),
    ("vqe_h2", ["--plot", "x.pdfx"], "pdfx"),
    ("vqe_h2", ["--shots", "10", "--diff-method", "adjoint", "--steps", "1"], "adjoint"),
    ("bond_dissociation", ["--points", "0"], "--points"),
    ("bond_dissociation", ["--rmin", "2", "--rmax", "1"], "--rmax"),
    ("vqe_spin_chain", ["--spins", "1"], "--spins"),
    ("vqe_spin_chain", ["--spins", "5", "--model", "heisenberg"], "even"),
    ("vqe_spin_chain", ["--ansatz", "givens"], "--ansatz givens"),
    ("hybrid_classifier", ["--batch", "0"], "--batch"),
    ("noise_aware_vqe", ["--steps", "0"], "--steps"),
    ("noise_aware_vqe", ["--backend", "fake_lima", "--steps", "1"], "not native"),
    ("vqe_h2_ibm_fake", ["--steps", "0"], "--steps"),
    ("quickstart", ["--steps", "3"], "unrecognized"),
])
def test_bad_options_are_one_line_and_exit_2(name, argv, what, tmp_path, capsys):
    """As ``python examples/NAME.py ARGV`` runs it (``_cli.run``): exit code 2, one line on
    stderr naming the option, before any long work (the plot path is checked up front)."""
    if name == "noise_aware_vqe" and "fake_lima" in argv:
        pytest.importorskip("qiskit_ibm_runtime")
    argv = [str(tmp_path / a) if a.endswith((".png", ".pdfx")) else a for a in argv]
    main = load(name).main
    with pytest.raises(SystemExit) as exc:
        load("_cli").run(lambda: main(argv))
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.count("\n") == 1 and what in err, err


def test_spin_chain_checks_both_plot_paths_before_the_runs(tmp_path, capsys):
    """With both models, the two plot files (x_tfim.png, x_heisenberg.png) are checked up
    front: a read-only one is exit 2 before any optimization step."""
    target = tmp_path / "x_heisenberg.png"
    target.write_text("keep")
    target.chmod(0o444)
    if os.access(target, os.W_OK) and os.geteuid() != 0:
        pytest.skip("cannot make a read-only file here")
    main = load("vqe_spin_chain").main
    with pytest.raises(SystemExit) as exc:
        load("_cli").run(lambda: main(["--spins", "4", "--plot", str(tmp_path / "x.png")]))
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and "x_heisenberg.png" in err and err.count("\n") == 1, err
    assert "step" not in out and target.read_text() == "keep"


def test_interrupt_is_one_line_and_exit_130(capsys):
    """Ctrl-C in a script's run is one line on stderr and exit code 130, not a traceback."""
    import signal

    def interrupted():
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exc:
            load("_cli").run(interrupted)
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert exc.value.code == 130 and err.count("\n") == 1 and "interrupted" in err, err


def test_mapping_other_than_jordan_wigner_is_refused(common):
    """The sector energy and Givens excitations are those of occupation-number qubits: under
    parity the 'sector' would be the wrong states (-0.53 Ha for H2 instead of -1.137 Ha)."""
    with pytest.raises(qd.QdiffError, match="mapping='parity'"):
        common.molecular_problem("H2", mapping="parity")


@pytest.mark.parametrize("script", ["vqe_h2.py", "quickstart.py"])
def test_interrupt_while_the_script_imports_is_one_line_and_exit_130(script):
    """Ctrl-C that lands while a script still imports torch and qdiff (its first second or
    more) is the same one line and exit code 130, not an import traceback."""
    import signal
    import subprocess
    import time
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                        script)
    proc = subprocess.Popen([sys.executable, path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err == f"{script}: error: interrupted\n", err


def test_a_pgf_plot_without_its_tex_engine_is_refused_before_the_run(tmp_path, monkeypatch):
    """matplotlib lists .pgf among its formats but writes it through a TeX engine: without
    one the plot would fail after the whole run, so it is refused up front."""
    cli = load("_cli")
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(qd.QdiffError, match=r"writes '\.pgf' through .*not installed"):
        cli.check_plot(str(tmp_path / "out.pgf"))
    cli.check_plot(str(tmp_path / "out.png"))
