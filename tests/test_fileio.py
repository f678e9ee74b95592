"""Safe writes (qdiff.circuits.fileio): atomic, symlink-safe, mode-keeping, thread-safe, and
clean on exceptions and signals."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from qdiff.circuits import fileio, qasm
from qdiff.circuits.errors import QdiffError
from qdiff.circuits.fileio import ReadOnlyOutputError, atomic_open, write_atomic

BELL = 'OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\nh q[0];\ncx q[0],q[1];\n'


def names(folder) -> list:
    return sorted(os.listdir(folder))


def test_symlink_planted_at_old_predictable_temp_name_is_not_followed(tmp_path):
    """The former temp name was ``.out.qasm.tmp<PID>``: a link planted there made the write
    land in the victim. Now the temp file is created with O_EXCL under a random name."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out.qasm"
    for pid in {os.getpid(), os.getpid() + 1}:
        os.symlink(victim, tmp_path / f".out.qasm.tmp{pid}")
    write_atomic(out, BELL)
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and out.read_text() == BELL


def test_temp_names_are_unique_and_created_exclusively(tmp_path, monkeypatch):
    seen = []
    real = fileio.tempfile.mkstemp

    def spy(**kw):
        fd, name = real(**kw)
        seen.append((name, os.fstat(fd)))
        return fd, name
    monkeypatch.setattr(fileio.tempfile, "mkstemp", spy)
    for _ in range(3):
        write_atomic(tmp_path / "out.qasm", BELL)
    assert len({n for n, _ in seen}) == 3
    assert all(os.path.dirname(n) == str(tmp_path) for n, _ in seen)
    assert all(stat.S_IMODE(st.st_mode) == 0o600 for _, st in seen)  # private until renamed
    assert names(tmp_path) == ["out.qasm"]


def test_symlink_at_the_output_path_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out.qasm"
    os.symlink(victim, out)
    qasm.dump(qasm.loads(BELL).circuit, out)
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and "cx q[0],q[1];" in out.read_text()


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_existing_mode_is_kept(tmp_path, mode):
    out = tmp_path / "out.qasm"
    out.write_text("old")
    os.chmod(out, mode)
    write_atomic(out, "new")
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == mode


def test_new_file_gets_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "new.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640


def test_read_only_output_refused_unless_forced(tmp_path):
    out = tmp_path / "out.qasm"
    out.write_text("keep me")
    os.chmod(out, 0o444)
    with pytest.raises(ReadOnlyOutputError, match=r"out.qasm: the existing file is read-only "
                                                   r"\(mode 0444\)"):
        write_atomic(out, "new")
    assert out.read_text() == "keep me" and names(tmp_path) == ["out.qasm"]
    write_atomic(out, "new", force=True)
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == 0o444


def test_directory_and_missing_folder_are_clear_errors(tmp_path):
    with pytest.raises(QdiffError, match="is a directory"):
        write_atomic(tmp_path, "x")
    with pytest.raises(QdiffError, match=r"nope/out.qasm: cannot write"):
        write_atomic(tmp_path / "nope" / "out.qasm", "x")


def test_fifo_and_devices_are_written_directly_not_replaced(tmp_path):
    """``-o /dev/null`` once renamed a regular file over /dev/null (as root: for everyone).
    Special files are opened and written in place; a FIFO shows it (a reader gets the data
    and the FIFO stays a FIFO)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_atomic(fifo, "streamed")
    reader.join(timeout=30)
    assert got == ["streamed"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert names(tmp_path) == ["pipe"]


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_exception_in_the_write_removes_temp_and_keeps_old(tmp_path, exc):
    out = tmp_path / "out.qasm"
    out.write_text("previous")
    with pytest.raises(exc):
        with atomic_open(out) as fh:
            fh.write("half a fi")
            raise exc()
    assert out.read_text() == "previous" and names(tmp_path) == ["out.qasm"]


def test_failed_rename_removes_temp(tmp_path, monkeypatch):
    out = tmp_path / "out.qasm"
    out.write_text("previous")

    def fail(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fileio.os, "replace", fail)
    with pytest.raises(QdiffError, match="out.qasm: cannot write \\(No space left on device\\)"):
        write_atomic(out, "new")
    assert out.read_text() == "previous" and names(tmp_path) == ["out.qasm"]


def test_signal_during_temp_creation_is_delivered_after_the_name_is_recorded(tmp_path,
                                                                            monkeypatch):
    """SIGINT arriving while mkstemp runs would strand an unnamed temp file; it is held until
    the name is recorded, then raised, and the file removed."""
    real = fileio.tempfile.mkstemp

    def interrupted_mkstemp(**kw):
        fd, name = real(**kw)
        signal.raise_signal(signal.SIGINT)  # the Python handler runs at the next bytecode
        return fd, name
    monkeypatch.setattr(fileio.tempfile, "mkstemp", interrupted_mkstemp)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "out.qasm", "x")
    assert names(tmp_path) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_threads_writing_one_path_never_expose_partial_files(tmp_path):
    """Several threads ``qasm.dump`` to one path while readers poll it: no error, and every
    read sees one complete program (the temp name was per process before)."""
    out = tmp_path / "out.qasm"
    circuits = [qasm.loads(BELL.replace("h q[0];", "h q[0];\n" + "x q[1];\n" * k)).circuit
                for k in range(1, 5)]
    texts = {qasm.dumps(c) for c in circuits}
    qasm.dump(circuits[0], out)
    errors, seen, stop = [], set(), threading.Event()

    def writer(c):
        try:
            for _ in range(30):
                qasm.dump(c, out)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    def reader():
        while not stop.is_set():
            seen.add(out.read_text())
    readers = [threading.Thread(target=reader) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(c,)) for c in circuits]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    assert seen <= texts and seen
    assert names(tmp_path) == ["out.qasm"]


def test_sigterm_inside_the_write_window_leaves_no_temp_file(tmp_path):
    """The CLI's SIGTERM handler unwinds like Ctrl-C: exit 130, one line, old output kept."""
    src = tmp_path / "in.qasm"
    src.write_text(BELL)
    out = tmp_path / "out.qasm"
    out.write_text("previous")
    marker = tmp_path / "in_window"
    script = textwrap.dedent(f"""
        import os, sys, time
        from qdiff.circuits import fileio
        from qdiff.cli import main
        real = os.fsync
        def slow_fsync(fd):
            open({str(marker)!r}, "w").close()
            time.sleep(60)
        fileio.os.fsync = slow_fsync
        sys.exit(main(["compile", {str(src)!r}, "-o", {str(out)!r}]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1]
    temps = [n for n in names(tmp_path) if n.startswith(".out.qasm.")]
    assert len(temps) == 1  # the write was in progress
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines() == ["qdiff: error: terminated (SIGTERM); no partial output "
                                        "was written"]
    assert out.read_text() == "previous"
    assert names(tmp_path) == ["in.qasm", "in_window", "out.qasm"]


def test_read_text_is_capped_and_rejects_binary(tmp_path):
    empty = tmp_path / "empty.qasm"
    empty.write_text("")
    assert fileio.read_text(empty, 10) == ""
    big = tmp_path / "big.qasm"
    big.write_text("x" * 11)
    with pytest.raises(QdiffError, match=r"big.qasm: larger than the input limit of 10 bytes"):
        fileio.read_text(big, 10)
    nul = tmp_path / "nul.qasm"
    nul.write_bytes(b"OPENQASM 2.0;\x00")
    with pytest.raises(QdiffError, match="NUL bytes"):
        fileio.read_text(nul, 100)
    with pytest.raises(QdiffError, match="/dev/zero: larger than the input limit of 1 MiB"):
        fileio.read_text("/dev/zero", 2 ** 20)  # an endless stream: read up to the cap only


def test_bytes_paths_and_unwritable_input_are_clear_errors(tmp_path):
    """A bytes path is written like its str; a NUL byte in the path, text that UTF-8 cannot
    encode and data that is not text are QdiffErrors, and the old file stays as it was."""
    target = tmp_path / "out.txt"
    write_atomic(os.fsencode(target), "via bytes\n")
    assert target.read_text() == "via bytes\n"
    with pytest.raises(QdiffError, match="NUL byte"):
        write_atomic(str(tmp_path / "a\0b"), "x")
    with pytest.raises(QdiffError, match="NUL byte"):
        fileio.read_text(str(tmp_path / "a\0b"), 100)
    with pytest.raises(QdiffError, match="not encodable as utf-8"):
        write_atomic(target, "ok \udcff")
    with pytest.raises(QdiffError, match="data must be str or bytes; got int"):
        write_atomic(target, 5)
    with pytest.raises(QdiffError, match="output path must be"):
        write_atomic(3.5, "x")
    assert target.read_text() == "via bytes\n"
    assert sorted(os.listdir(tmp_path)) == ["out.txt"]
