"""The native kernel cache cannot crash the process: a library is loaded only when its bytes
match the hash written at build time; a truncated, corrupted or stale file is rebuilt (one
build at a time across processes); a failed build is a visible warning and the torch kernels
take over. Damage is done in child processes, so a crash would show as a failed exit code.

A stand-in compiler (a script that installs the library this test run already verified)
keeps these tests fast; one slow test rebuilds with the real compiler."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import qdiff as qd
from qdiff.backends.statevector import native

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: the native kernels are not built")

CHILD = textwrap.dedent("""
    import warnings, torch, qdiff as qd
    from qdiff.backends.statevector import native
    from qdiff.backends.statevector.simulate import simulate
    from qdiff.circuits import Circuit, Operation, ParamRef, get_gate
    warnings.simplefilter("always")
    n = 14
    ops = [Operation(get_gate("h"), (w,)) for w in range(n)]
    ops += [Operation(get_gate("rx"), (w,), (ParamRef(w),)) for w in range(n)]
    ops += [Operation(get_gate("cx"), (w, (w + 1) % n)) for w in range(n)]
    ops += [Operation(get_gate("rot"), (w,), (ParamRef(w), 0.2, ParamRef(n - 1 - w)))
            for w in range(n)]
    c = Circuit(n, tuple(ops), num_params=n)
    theta = torch.linspace(-1, 1, 2 * n, dtype=torch.float64).reshape(2, n)
    with torch.no_grad():
        ours = [simulate(c, theta, cdtype=d) for d in (torch.complex128, torch.complex64)]
        with native.disabled():
            ref = [simulate(c, theta, cdtype=d) for d in (torch.complex128, torch.complex64)]
    ok = all(torch.allclose(a.to(b.dtype), b, atol=1e-5) for a, b in zip(ours, ref))
    st = qd.native_status()
    print("STATUS", st.available, ok, "|", st.reason)
""")


def _fake_cc(tmp_path: Path, sleep: float = 0.0, broken: bool = False) -> Path:
    """A 'compiler' that installs the verified library of this test run and logs each build
    (``broken``: the same compiler, as far as the cache key knows, whose builds fail)."""
    pristine = tmp_path / "pristine.so"
    pristine.write_bytes(Path(qd.native_status().library).read_bytes())
    cc = tmp_path / ("brokencc" if broken else "fakecc")
    cc.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "fakecc 1.0"; exit 0; fi
        echo build >> "{tmp_path / 'builds.log'}"
        {"exit 1" if broken else ""}
        sleep {sleep}
        while [ $# -gt 0 ]; do
          if [ "$1" = "-o" ]; then shift; cp "{pristine}" "$1"; exit 0; fi
          shift
        done
        exit 1
        """))
    cc.chmod(0o755)
    return cc


def _run_child(tmp_path: Path, cc, extra_env=None, code=CHILD):
    env = dict(os.environ, QDIFF_CACHE_DIR=str(tmp_path / "cache"), CC=str(cc))
    env.pop("QDIFF_NATIVE", None)
    env.update(extra_env or {})
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, f"child died (rc {res.returncode}): {res.stderr[-2000:]}"
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("STATUS"))
    return line.split("|")[0].split()[1:], res


def _builds(tmp_path: Path) -> int:
    log = tmp_path / "builds.log"
    return len(log.read_text().split()) if log.exists() else 0


def _library(tmp_path: Path) -> Path:
    [so] = (tmp_path / "cache" / "native").glob("qdsim-*.so")
    return so


def _truncate(so: Path):
    with open(so, "r+b") as fh:
        fh.truncate(so.stat().st_size // 3)


def _corrupt_code(so: Path):
    blob = bytearray(so.read_bytes())
    mid = len(blob) // 2
    blob[mid:mid + 4096] = b"\x0f\x0b" * 2048  # ud2 instructions: SIGILL if ever executed
    so.write_bytes(bytes(blob))


def _stale_hash(so: Path):
    meta = so.with_name(so.name + ".sha256")
    meta.write_text("0" * 64 + " -march=native -fopenmp\n")


def _hash_missing(so: Path):
    so.with_name(so.name + ".sha256").unlink()


@pytest.mark.parametrize("damage", [_truncate, _corrupt_code, _stale_hash, _hash_missing],
                         ids=["truncated", "corrupt-code", "stale-hash", "hash-missing"])
def test_damaged_cache_is_rebuilt_and_results_are_correct(tmp_path, damage):
    cc = _fake_cc(tmp_path)
    assert _run_child(tmp_path, cc)[0] == ["True", "True"]
    assert _builds(tmp_path) == 1
    so = _library(tmp_path)
    good = so.read_bytes()
    damage(so)
    assert _run_child(tmp_path, cc)[0] == ["True", "True"]
    assert _builds(tmp_path) == 2  # rebuilt once
    assert _library(tmp_path).read_bytes() == good
    assert _run_child(tmp_path, cc)[0] == ["True", "True"]
    assert _builds(tmp_path) == 2  # and then reused


@pytest.mark.parametrize("damage", [_truncate, _corrupt_code], ids=["truncated", "corrupt"])
def test_damaged_cache_without_a_compiler_falls_back_to_torch(tmp_path, damage):
    """The damaged file is never loaded (no SIGBUS/SIGILL): with no working compiler the
    torch kernels run, with one warning and a status that says why."""
    cc = _fake_cc(tmp_path)
    _run_child(tmp_path, cc)
    damage(_library(tmp_path))
    status, res = _run_child(tmp_path, _fake_cc(tmp_path, broken=True))
    assert status == ["False", "True"]
    assert _builds(tmp_path) > 1  # the damaged file was seen, and a rebuild tried
    assert "build failed" in res.stdout
    assert res.stderr.count("RuntimeWarning") == 1 and "qdiff doctor" in res.stderr


def test_running_process_survives_its_cache_file_being_truncated(tmp_path):
    """The verified bytes are loaded from memory: damaging the cache file afterwards cannot
    fault the pages of a running process."""
    cc = _fake_cc(tmp_path)
    _run_child(tmp_path, cc)
    code = CHILD.replace("warnings.simplefilter", textwrap.dedent("""\
        from qdiff.backends.statevector import native_lib
        from pathlib import Path
        native.library()
        so = Path(native_lib.native_status().library)
        with open(so, "r+b") as fh:
            fh.truncate(0)
        warnings.simplefilter"""))
    assert _run_child(tmp_path, cc, code=code)[0] == ["True", "True"]


def test_concurrent_first_use_builds_once(tmp_path):
    cc = _fake_cc(tmp_path, sleep=2.0)
    env = dict(os.environ, QDIFF_CACHE_DIR=str(tmp_path / "cache"), CC=str(cc))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    assert all("STATUS True True" in o[0] for o in outs)
    assert _builds(tmp_path) == 1


def _old_builds(cache: Path, count: int, start: float) -> list:
    """``count`` stand-in libraries of other builds (with hash and lock files), used at
    ``start``, ``start + 1``, ... seconds since the epoch."""
    cache.mkdir(parents=True, exist_ok=True)
    libs = []
    for i in range(count):
        so = cache / f"qdsim-old{i:012d}.so"
        so.write_bytes(b"old")
        so.with_name(so.name + ".sha256").write_text("x\n")
        so.with_name(so.name + ".lock").write_text("")
        os.utime(so, (start + i, start + i))
        libs.append(so)
    return libs


def test_a_new_build_prunes_the_least_recently_used(tmp_path):
    """Each new build keeps the cache at the most recently used libraries: older builds go
    with their hash and lock files, a lock left without its library for more than a day goes,
    and a library whose lock another process holds stays."""
    import fcntl
    from qdiff.backends.statevector import native_lib
    cache = tmp_path / "cache" / "native"
    keep = native_lib.KEEP_BUILDS
    libs = _old_builds(cache, keep + 3, start=1_000_000)
    orphan = cache / "qdsim-orphan00000000.so.lock"
    orphan.write_text("")
    os.utime(orphan, (1_000_000, 1_000_000))
    fresh_orphan = cache / "qdsim-fresh000000000.so.lock"
    fresh_orphan.write_text("")  # a build may be starting: kept
    busy = libs[0]  # the oldest, but another process holds its lock
    with open(busy.with_name(busy.name + ".lock"), "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert _run_child(tmp_path, _fake_cc(tmp_path))[0] == ["True", "True"]
    assert _builds(tmp_path) == 1
    left = sorted(p.name for p in cache.glob("qdsim-*.so"))
    new = [n for n in left if "old" not in n]
    assert len(new) == 1
    # the new build and the keep - 1 most recent old ones, plus the busy one
    want = sorted([f"qdsim-old{i:012d}.so" for i in range(4, keep + 3)] + [busy.name] + new)
    assert left == want
    for lib in libs[1:4]:
        for suffix in ("", ".sha256", ".lock"):
            assert not lib.with_name(lib.name + suffix).exists()
    assert busy.with_name(busy.name + ".sha256").exists()
    assert not orphan.exists() and fresh_orphan.exists()


def test_a_cache_hit_marks_its_library_used(tmp_path):
    cc = _fake_cc(tmp_path)
    _run_child(tmp_path, cc)
    so = _library(tmp_path)
    os.utime(so, (1_000_000, 1_000_000))
    assert _run_child(tmp_path, cc)[0] == ["True", "True"]
    assert _builds(tmp_path) == 1 and so.stat().st_mtime > 1_000_000


def test_pruning_keeps_everything_it_cannot_read(tmp_path):
    from qdiff.backends.statevector import native_lib
    missing = tmp_path / "nowhere" / "qdsim-x.so"
    assert native_lib._prune(missing) == []


def test_disabled_status_says_why(tmp_path):
    status, _ = _run_child(tmp_path, "cc", extra_env={"QDIFF_NATIVE": "0"})
    assert status == ["False", "True"]


@pytest.mark.parametrize("var,value", [("QDIFF_NATIVE", "maybe"), ("QDIFF_NATIVE_TILES", "3"),
                                       ("QDIFF_NATIVE_TILES", "fast")])
def test_unknown_switch_values_are_errors(var, value, monkeypatch):
    from qdiff.backends.statevector import native_abi, native_lib
    monkeypatch.setenv(var, value)
    read = native_lib._disabled_by_env if var == "QDIFF_NATIVE" else native_abi.tiles
    with pytest.raises(qd.QdiffError, match=rf"{var}='{value}': expected"):
        read()


@pytest.mark.parametrize("value,off", [("0", True), ("off", True), ("FALSE", True), ("1", False),
                                       (" on ", False), ("yes", False)])
def test_native_switch_values(value, off, monkeypatch):
    from qdiff.backends.statevector import native_lib
    monkeypatch.setenv("QDIFF_NATIVE", value)
    assert native_lib._disabled_by_env() is off


def test_tile_modes(monkeypatch):
    from qdiff.backends.statevector import native_abi
    for value, mode in [("0", 0), ("off", 0), ("1", 1), ("", 1), ("2", 2), ("Always", 2)]:
        monkeypatch.setenv("QDIFF_NATIVE_TILES", value)
        assert native_abi.tiles() == mode


def test_extra_flags_follow_the_builds_own_and_key_the_cache(tmp_path):
    """QDIFF_NATIVE_CFLAGS reaches the compiler after the build's own flags (a later -O1
    overrides -O3), shows in the status, and builds a library of its own."""
    cc = _fake_cc(tmp_path)
    args_log = tmp_path / "args.log"
    logging_cc = tmp_path / "argscc"
    logging_cc.write_text(f'#!/bin/sh\n[ "$1" = "--version" ] || echo "$@" >> "{args_log}"\n'
                          f'exec "{cc}" "$@"\n')
    logging_cc.chmod(0o755)
    code = CHILD + "print('FLAGS', *st.flags)\n"
    flags = "-O1 -DQD_PROBE='a b'"
    assert _run_child(tmp_path, logging_cc, code=code)[0] == ["True", "True"]
    status, res = _run_child(tmp_path, logging_cc, {"QDIFF_NATIVE_CFLAGS": flags}, code=code)
    assert status == ["True", "True"] and _builds(tmp_path) == 2
    cmds = args_log.read_text().splitlines()
    assert "-O1" not in cmds[0] and "-DQD_PROBE=a b" in cmds[1]
    assert cmds[1].index("-O3") < cmds[1].index("-O1") < cmds[1].index("qdsim.c")
    assert "-O1" in next(ln for ln in res.stdout.splitlines() if ln.startswith("FLAGS"))
    assert len(list((tmp_path / "cache" / "native").glob("qdsim-*.so"))) == 2
    _run_child(tmp_path, logging_cc, {"QDIFF_NATIVE_CFLAGS": flags}, code=code)
    assert _builds(tmp_path) == 2  # the flagged library is reused


def test_extra_flags_unbalanced_quote_is_named(monkeypatch):
    from qdiff.backends.statevector import native_lib
    monkeypatch.setenv("QDIFF_NATIVE_CFLAGS", "-DX='a")
    with pytest.raises(qd.QdiffError, match="QDIFF_NATIVE_CFLAGS"):
        native_lib.extra_flags()
    monkeypatch.setenv("QDIFF_NATIVE_CFLAGS", " -O1  -g ")
    assert native_lib.extra_flags() == ["-O1", "-g"]


def test_doctor_reports_the_kernels(capsys):
    from qdiff.cli import main
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "native kernels: on" in out and "threads:" in out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no cc")
def test_real_rebuild_after_truncation(tmp_path):
    status, _ = _run_child(tmp_path, "cc")
    assert status == ["True", "True"]
    _truncate(_library(tmp_path))
    assert _run_child(tmp_path, "cc")[0] == ["True", "True"]


def test_child_crash_would_be_seen():
    """The harness above does see a crash (a child killed by SIGSEGV fails the check)."""
    res = subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), "
                          f"{int(signal.SIGSEGV)})"], timeout=60)
    assert res.returncode == -signal.SIGSEGV
