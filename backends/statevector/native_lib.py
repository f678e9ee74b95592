"""Building, caching and loading the native kernels (``qdsim.c``), and the C boundary's layout.

The C sources ship with the package and are compiled on first use with the system C compiler
(``$CC`` or ``cc``; ``-O3 -march=native`` and OpenMP when the compiler takes them) into
``$QDIFF_CACHE_DIR/native`` (default ``~/.cache/qdiff/native``), named by a hash of the sources,
the compiler, the flags and the CPU. ``QDIFF_NATIVE_CFLAGS`` adds compiler flags after the build's
own (a later ``-O1`` overrides ``-O3``; a sanitizer build: ``-fsanitize=address,undefined -O1
-g``, run with the sanitizer runtime in ``LD_PRELOAD``); they are part of the cache key. Beside each library lies the SHA-256 of its bytes, written
at build time. A library is loaded only when its bytes match that hash; anything else (a
missing, truncated, corrupted or stale file) is rebuilt, one build at a time across processes
(an exclusive ``fcntl.flock`` on a lock file beside it). The verified bytes are loaded from an
anonymous in-memory file, so a cache file damaged later cannot crash a running process.

A failed build leaves the torch kernels in charge (same results, slower) and says so once with
a ``RuntimeWarning``; :func:`native_status` (``qd.native_status()``, ``qdiff doctor``) tells
whether the native kernels run, and why not. ``QDIFF_NATIVE=0`` turns them off.

>>> st = native_status()
>>> isinstance(st.available, bool) and (st.available or bool(st.reason))
True
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import signal
import subprocess
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from qdiff.circuits import caches
from qdiff.circuits.errors import QdiffError
from qdiff.backends.statevector.native_abi import check_abi

log = logging.getLogger(__name__)

_DIR = Path(__file__).parent
SOURCES = ("qdsim.c", "qdsim.h", "qdsim_kernels.h", "qdsim_batch.h")
_FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
          "-fassociative-math", "-shared", "-fPIC", "-std=c99"]
# tried in order: OpenMP and the host's vector units, then without OpenMP, then portable code
_VARIANTS = (["-march=native", "-fopenmp"], ["-march=native"], [])


@dataclass(frozen=True)
class NativeStatus:
    """Whether the native kernels run in this process, and why not.

    ``available``: loaded and checked; ``reason``: why not ("" when available); ``library``:
    the cached shared object; ``compiler`` and ``flags`` of its build; ``openmp``: built with
    OpenMP (threads follow ``torch.get_num_threads()``)."""

    available: bool
    reason: str = ""
    library: Optional[str] = None
    compiler: str = ""
    flags: tuple = ()
    openmp: bool = False

    def __str__(self) -> str:
        if not self.available:
            return f"native kernels: off ({self.reason}); the torch kernels run instead"
        return (f"native kernels: on ({self.library}; {self.compiler.splitlines()[0] if self.compiler else 'cc'}; "
                f"{' '.join(self.flags) or 'portable'}; OpenMP {'yes' if self.openmp else 'no'})")


_LOCK = threading.Lock()
_state: dict = {"lib": None, "status": None, "warned": False}


def cache_dir() -> Path:
    root = os.environ.get("QDIFF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "qdiff")
    return Path(root) / "native"


def _cpu_tag() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((ln for ln in fh if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return platform.machine() + platform.processor() + flags


def extra_flags() -> list:
    """``QDIFF_NATIVE_CFLAGS``: compiler flags added after the build's own (split as a shell
    splits words); ``[]`` when unset."""
    value = os.environ.get("QDIFF_NATIVE_CFLAGS", "")
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise QdiffError(f"QDIFF_NATIVE_CFLAGS={value!r}: {exc}") from None


def _disabled_by_env() -> bool:
    """``QDIFF_NATIVE``: 0/off/false/no turns the native kernels off, 1/on/true/yes (the
    default) leaves them on; any other value is an error."""
    value = os.environ.get("QDIFF_NATIVE", "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return True
    if value in ("1", "true", "yes", "on", ""):
        return False
    raise QdiffError(f"QDIFF_NATIVE={value!r}: expected 0 or 1 (off/on, false/true, no/yes)")


def library():
    """The loaded kernel library (checked), or ``None`` (disabled, no compiler, build failed)."""
    if _state["status"] is not None:
        return _state["lib"]
    with _LOCK:
        if _state["status"] is None:
            lib, status = _load()
            _state["lib"], _state["status"] = lib, status
            if not status.available and status.reason.startswith("build failed"):
                _warn_once(status.reason)
    return _state["lib"]


def release_scratch() -> int:
    """Free the scratch the kernels keep between calls (their tile buffers and the adjoint
    sweep's copies of psi and lam, at most 64 MiB in all: a fresh block costs a page fault per
    4 KiB on first touch); returns the bytes still kept (blocks in use by a running call).
    ``qdiff.clear_caches()`` calls it; a library not loaded yet is not loaded for it."""
    lib = _state["lib"]
    return 0 if lib is None else max(int(lib.qd_scratch_release()), 0)


def scratch_held() -> int:
    """Bytes of scratch the loaded kernels keep between calls (0 when none is loaded)."""
    lib = _state["lib"]
    return 0 if lib is None else max(int(lib.qd_scratch_held()), 0)


caches.register("native.scratch", None, clear=release_scratch)


def native_status() -> NativeStatus:
    """:class:`NativeStatus` of this process (builds the kernels if needed)."""
    library()
    return _state["status"]


def reset(lib=None, status=None) -> tuple:
    """Replace the loaded state (``None, None``: load again on next use); returns the old one.
    Tests and :func:`~qdiff.backends.statevector.native.disabled` use it."""
    with _LOCK:
        old = (_state["lib"], _state["status"])
        _state["lib"], _state["status"] = lib, status
    return old


def _warn_once(reason: str) -> None:
    if _state["warned"]:
        return
    _state["warned"] = True
    msg = (f"qdiff: native kernels unavailable ({reason}); using the slower torch kernels. "
           "Run `qdiff doctor` for details.")
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _load():
    if _disabled_by_env():
        return None, NativeStatus(False, "disabled by QDIFF_NATIVE=0")
    cc = os.environ.get("CC", "cc")
    user = extra_flags()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, NativeStatus(False, f"build failed: no C compiler ({cc}: {exc})")
    try:
        sources = b"".join((_DIR / name).read_bytes() for name in SOURCES)
    except OSError as exc:
        return None, NativeStatus(False, f"kernel sources missing: {exc}")
    flags_key = (_FLAGS, _VARIANTS) + ((user,) if user else ())
    key = hashlib.sha256(sources + version.encode() + _cpu_tag().encode()
                         + repr(flags_key).encode()).hexdigest()[:16]
    out = cache_dir() / f"qdsim-{key}.so"
    try:
        blob, flags = _verified_or_built(out, cc, user)
    except OSError as exc:
        return None, NativeStatus(False, f"build failed: kernel cache {out.parent}: {exc}")
    if blob is None:
        return None, NativeStatus(False, f"build failed: {flags}", compiler=version)
    try:
        lib = _open(blob, out)
        problem = check_abi(lib)
    except OSError as exc:
        return None, NativeStatus(False, f"cannot load {out}: {exc}", str(out), version)
    if problem:
        return None, NativeStatus(False, problem, str(out), version)
    return lib, NativeStatus(True, "", str(out), version, tuple(flags), "-fopenmp" in flags)


def _digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _read_verified(out: Path):
    """``(bytes, flags)`` of the cached library when its hash file matches, else ``None``."""
    try:
        blob = out.read_bytes()
        meta = out.with_name(out.name + ".sha256").read_text().split()
    except OSError:
        return None
    if len(meta) < 1 or meta[0] != _digest(blob):
        return None
    return blob, meta[1:]


def _verified_or_built(out: Path, cc: str, user: list = ()):
    hit = _read_verified(out)
    if hit is not None:
        _touch(out)
        return hit
    import fcntl
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time across processes
        try:
            hit = _read_verified(out)  # built by another process meanwhile
            if hit is not None:
                return hit
            if out.exists():
                log.warning("qdiff: rebuilding the damaged or stale native kernel cache %s", out)
            built = _build(out, cc, user)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if built[0] is not None:
        _prune(out)
    return built


KEEP_BUILDS = 8  # libraries kept in the cache: the most recently used ones


def _touch(out: Path) -> None:
    """Mark a cached library as used now (its modification time orders the pruning)."""
    try:
        os.utime(out)
    except OSError:
        pass


def _prune(out: Path, keep: int = KEEP_BUILDS) -> list:
    """Remove the cache's libraries beyond the ``keep`` most recently used (``out``, just
    built, always stays), each with its hash file and its lock file, and lock files older than
    a day without a library (left by a build that was killed). A library another process is
    building or checking (its lock held) is skipped; a running process is unaffected (it runs
    from its own in-memory copy). Returns the paths removed; errors leave files in place."""
    import fcntl
    import time
    removed = []
    try:
        entries = [p for p in out.parent.iterdir() if p.name.startswith("qdsim-")]
    except OSError:
        return removed
    libs = []
    for p in entries:
        if p.suffix == ".so" and p != out:
            try:
                libs.append((p.stat().st_mtime, p))
            except OSError:
                pass
    libs.sort(reverse=True)
    doomed = [p for _, p in libs[max(keep - 1, 0):]]
    now = time.time()
    for p in entries:
        if p.name.endswith(".so.lock") and not p.with_name(p.name[:-5]).exists():
            try:
                if now - p.stat().st_mtime > 86400:
                    doomed.append(p.with_name(p.name[:-5]))
            except OSError:
                pass
    for lib in doomed:
        lock_path = lib.with_name(lib.name + ".lock")
        try:
            with open(lock_path, "a+") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # in use by another process: left for a later pruning
                for f in (lib, lib.with_name(lib.name + ".sha256"), lock_path):
                    try:
                        f.unlink()
                        removed.append(f)
                    except FileNotFoundError:
                        pass
        except OSError:
            continue
    return removed


def _build(out: Path, cc: str, user: list = ()):
    """Compile into a temporary file, then install it and its hash atomically (the hash
    last: a reader never accepts a library whose hash was not written for it). ``user``:
    flags added after the build's own (:func:`extra_flags`)."""
    errors = []
    for extra in _VARIANTS:
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            problem = _compile([cc, *_FLAGS, *extra, *user, str(_DIR / "qdsim.c"), "-o",
                                str(tmp_out)])
            if problem:
                errors.append(problem)
                log.debug("native build with %s failed: %s", extra, problem)
                continue
            blob = tmp_out.read_bytes()
            meta = Path(tmp) / "meta"
            meta.write_text(" ".join([_digest(blob), *extra, *user]) + "\n")
            os.replace(tmp_out, out)
            os.replace(meta, out.with_name(out.name + ".sha256"))
            return blob, [*extra, *user]
    return None, f"{cc} could not compile qdsim.c ({'; '.join(errors)[-300:]})"


_BUILD_TIMEOUT = 900  # seconds: a loaded machine compiles slowly; the result is cached


def _compile(cmd: list) -> str:
    """Run the compiler in its own process group (killed whole on time-out); returns the
    problem, "" on success."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as exc:
        return str(exc)
    try:
        _, err = proc.communicate(timeout=_BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"timed out after {_BUILD_TIMEOUT} s"
    if proc.returncode != 0:
        lines = err.strip().splitlines()
        return lines[-1] if lines else f"exit {proc.returncode}"
    return ""


def _open(blob: bytes, out: Path):
    """Load the verified bytes: from an in-memory file where the platform has one (the
    mapping then never depends on the cache file again), else from the cache path."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("qdsim", 0)
        try:
            os.write(fd, blob)
            return ctypes.CDLL(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)  # the mapping keeps the memory alive
    return ctypes.CDLL(str(out))
