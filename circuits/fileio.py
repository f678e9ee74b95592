"""Safe file input and output: atomic, symlink-safe writes and size-capped reads.

Every file qdiff writes (compiled QASM, ``qasm.dump``, plots) goes through :func:`atomic_open`:

* the data goes to a fresh temp file in the target's folder, made by ``tempfile.mkstemp``
  (``O_CREAT|O_EXCL`` and a random name: it never opens an existing file or follows a symlink
  planted in the folder; every call, thread or process gets its own name);
* it is flushed and fsynced, given the mode of the file it replaces (or ``0o666 & ~umask``
  for a new file), then renamed over the target with ``os.replace``: readers see the old
  complete file or the new complete file, never an empty or partial one;
* an existing read-only target is refused (:class:`ReadOnlyOutputError`) unless ``force``;
* on any exception (``KeyboardInterrupt`` and a SIGTERM handler's exception included) the temp
  file is removed and the target is untouched. Python-level SIGINT/SIGTERM handlers are held
  for the few instructions between creating the temp file and recording its name, so a signal
  cannot strand it.

A symlink at the target path is replaced by the new file (never written through); character
devices and FIFOs (``/dev/null``, ``/dev/stdout``) are written directly.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "out.txt")
>>> write_atomic(path, "hello\\n")
>>> open(path).read()
'hello\\n'
>>> sorted(os.listdir(os.path.dirname(path)))   # no temp file left beside it
['out.txt']
"""
from __future__ import annotations

import contextlib
import os
import signal
import stat
import tempfile
import threading

from qdiff.circuits.errors import QdiffError

_HELD_SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM") if hasattr(signal, s))


class ReadOnlyOutputError(QdiffError):
    """The output file exists and is read-only; it is replaced only with ``force=True``."""


def _cannot_write(path, exc: OSError) -> QdiffError:
    return QdiffError(f"{path}: cannot write ({exc.strerror or exc})")


def _umask() -> int:
    """The process umask, read without changing it (Linux), else by a set-and-restore."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


_UMASK_LOCK = threading.Lock()


def check_target(path, force: bool = False):
    """What replacing ``path`` means: ``None`` (new file, or a symlink that will be replaced),
    ``"special"`` (a device or FIFO, written directly) or the ``os.stat_result`` of the regular
    file whose mode the new one keeps. Raises for a directory, or a read-only file unless
    ``force``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    except ValueError:  # an embedded NUL byte
        raise QdiffError(f"{path!r}: cannot write (the path contains a NUL byte)") from None
    if stat.S_ISLNK(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        raise QdiffError(f"{path}: cannot write (it is a directory)")
    if not stat.S_ISREG(st.st_mode):
        return "special"
    read_only = not (st.st_mode & 0o222) or not os.access(path, os.W_OK)
    if read_only and not force:
        raise ReadOnlyOutputError(f"{path}: the existing file is read-only (mode "
                                  f"{stat.S_IMODE(st.st_mode):04o}); not replaced without force")
    return st


@contextlib.contextmanager
def signals_held():
    """Defer Python-level SIGINT/SIGTERM handlers (main thread only: they run nowhere else)
    for the duration of the block, then deliver what arrived meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list = []
    saved = {}
    for sig in _HELD_SIGNALS:
        handler = signal.getsignal(sig)
        if callable(handler):
            saved[sig] = handler
            signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", *, force: bool = False, encoding: str = "utf-8"):
    """``with atomic_open(path) as fh: fh.write(...)``: the file appears complete at ``path``
    when the block ends without an exception, and ``path`` is untouched otherwise.

    ``mode`` is ``"w"`` (text, ``encoding``) or ``"wb"``. Errors are :class:`QdiffError`
    naming the path.
    """
    if mode not in ("w", "wb"):
        raise QdiffError(f"atomic_open: mode must be 'w' or 'wb'; got {mode!r}")
    path = _text_path(path)
    target = check_target(path, force)
    kw = {"encoding": encoding} if mode == "w" else {}
    if target == "special":
        try:
            with open(path, mode, **kw) as fh:
                yield fh
        except OSError as exc:
            raise _cannot_write(path, exc) from None
        return
    folder = os.path.dirname(os.path.abspath(path))
    created: list = []
    try:
        with signals_held():
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                       dir=folder)
            created.append(tmp)
        with os.fdopen(fd, mode, **kw) as fh:
            yield fh
            fh.flush()
            _set_owner_and_mode(fh.fileno(), target)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        created.clear()
        _fsync_folder(folder)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    except UnicodeEncodeError as exc:
        raise QdiffError(f"{path}: cannot write (the text is not encodable as {encoding}: "
                         f"{exc.reason} at position {exc.start})") from None
    finally:
        for tmp in created:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _text_path(path) -> str:
    """``path`` (str, bytes or path-like) as a str; bytes are decoded as the OS does."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise QdiffError(f"output path must be a str, bytes or os.PathLike; got "
                         f"{type(path).__name__}") from None


def _set_owner_and_mode(fd: int, target) -> None:
    if target is None:
        os.fchmod(fd, 0o666 & ~_umask())
        return
    if hasattr(os, "fchown") and (target.st_uid, target.st_gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(OSError):  # only root may give a file away: keep ours then
            os.fchown(fd, target.st_uid, target.st_gid)
    os.fchmod(fd, stat.S_IMODE(target.st_mode))


def _fsync_folder(folder: str) -> None:
    """Make the rename durable; best effort (not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path, data, *, force: bool = False) -> None:
    """Write ``data`` (``str``, UTF-8, or ``bytes``) to ``path`` atomically (see module doc)."""
    if not isinstance(data, (str, bytes, bytearray)):
        raise QdiffError(f"write_atomic: data must be str or bytes; got {type(data).__name__}")
    with atomic_open(path, "wb" if isinstance(data, (bytes, bytearray)) else "w",
                     force=force) as fh:
        fh.write(data)


def save_figure(fig, path, *, force: bool = False, **savefig_kwargs) -> None:
    """``fig.savefig`` through :func:`atomic_open`; the format comes from the file suffix."""
    fmt = savefig_kwargs.pop("format", None) or os.path.splitext(os.fspath(path))[1][1:] or "png"
    with atomic_open(path, "wb", force=force) as fh:
        fig.savefig(fh, format=fmt, **savefig_kwargs)


def read_text(source, limit: int, name: str | None = None) -> str:
    """The text of a file path or an open stream, read with a cap of ``limit`` bytes
    (characters for a text stream). Larger inputs, unreadable or non-UTF-8 files and NUL
    bytes are a one-line :class:`QdiffError` naming ``name`` (default: the path)."""
    if hasattr(source, "read"):
        label = name or getattr(source, "name", "<stream>")
        data = _read_capped(source, limit, label)
    else:
        label = name or os.fsdecode(os.fspath(source))
        try:
            fh = open(source, "rb")
        except OSError as exc:
            raise QdiffError(f"{label}: cannot read ({exc.strerror or exc})") from None
        except ValueError:  # an embedded NUL byte
            raise QdiffError(f"{label!r}: cannot read (the path contains a NUL byte)") from None
        with fh:
            data = _read_capped(fh, limit, label)
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise QdiffError(f"{label}: not a text file (not UTF-8)") from None
    if "\x00" in data:
        raise QdiffError(f"{label}: not a text file (NUL bytes)")
    return data


def _read_capped(fh, limit: int, label: str):
    try:
        data = fh.read(limit + 1)
    except OSError as exc:
        raise QdiffError(f"{label}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise QdiffError(f"{label}: not a text file (not UTF-8)") from None
    if len(data) > limit:
        raise QdiffError(f"{label}: larger than the input limit of {_size(limit)}")
    return data


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"
