"""The memory model: what a computation may allocate, and one check against it.

Every large allocation (simulator states, verification states and unitaries, shot buffers,
batches of bindings) is stated in bytes *before* it is made and compared with the budget:

* ``available(device)``: on CPU the smaller of ``MemAvailable`` (``/proc/meminfo``) and the
  room left under a cgroup memory limit; on CUDA the free memory ``torch.cuda.mem_get_info``
  reports;
* ``budget(device)``: ``MARGIN`` (90%) of that, capped by the environment variable
  ``QDIFF_MEMORY_LIMIT`` (bytes, or with a ``K``/``M``/``G``/``T`` suffix) when it is set;
* ``require(need, what, device)``: raises :class:`~qdiff.circuits.errors.QdiffMemoryError`
  naming what needs the memory, how much, and the budget. Needs under ``ALWAYS_FITS`` (and
  under ``QDIFF_MEMORY_LIMIT`` when it is set) are accepted without reading the system's
  figures (the check sits on hot paths).

>>> require(1024, "a small buffer")            # fits: returns None
>>> try:
...     require(2.0 ** 80, "a 76-qubit statevector")
... except MemoryError as exc:
...     print(str(exc)[:47])
a 76-qubit statevector needs about 1.13e+15 GiB
"""
from __future__ import annotations

import math
import os

from qdiff.circuits.errors import QdiffMemoryError

MARGIN = 0.9  # of the available memory: the rest is for the interpreter, torch and the OS
ALWAYS_FITS = 64 * 2 ** 20  # bytes: below this no check reads /proc
_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def gib(nbytes: float) -> str:
    """``'1.5 GiB'`` (three significant digits)."""
    return f"{nbytes / 2 ** 30:.3g} GiB"


def _distinct(need: float, have: float) -> tuple:
    """``gib`` of both, with as many digits as it takes to tell them apart (a need just over
    the budget does not read as equal to it)."""
    for digits in range(3, 13):
        a, b = (f"{x / 2 ** 30:.{digits}g} GiB" for x in (need, have))
        if a != b:
            break
    return a, b


def _device_type(device) -> str:
    if device is None:
        return "cpu"
    return getattr(device, "type", None) or str(device).split(":")[0]


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup memory limit (v2, then v1), if there is one."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 2 ** 60:
            return max(0, limit - usage)
    return None


def available(device=None) -> int:
    """Bytes free for a new allocation on ``device`` (``"cpu"`` default, ``"cuda:0"``, ...)."""
    if _device_type(device) == "cuda":
        import torch
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    free = _meminfo_available()
    if free is None:
        free = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    room = _cgroup_room()
    return free if room is None else min(free, room)


def env_limit() -> int | None:
    """``QDIFF_MEMORY_LIMIT`` in bytes (``None`` when unset); a malformed value is an error."""
    raw = os.environ.get("QDIFF_MEMORY_LIMIT", "").strip()
    if not raw:
        return None
    text = raw.upper().removesuffix("B").removesuffix("I")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    try:
        value = float(text[:len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        from qdiff.circuits.errors import QdiffError
        raise QdiffError(f"QDIFF_MEMORY_LIMIT={raw!r}: expected bytes, optionally with a "
                         "K/M/G/T suffix (e.g. 8G)")
    return int(value)


def budget(device=None) -> int:
    """What one computation may allocate on ``device``: ``MARGIN`` of :func:`available`,
    capped by ``QDIFF_MEMORY_LIMIT``."""
    have = int(MARGIN * available(device))
    cap = env_limit()
    return have if cap is None else min(have, cap)


def require(need: float, what: str, device=None, hint: str = "") -> None:
    """Raise :class:`QdiffMemoryError` unless ``need`` bytes fit the budget of ``device``.

    ``what`` names the allocation for the message (``"verifying 24 qubits by unitary"``);
    ``hint`` (optional) says what the user can do instead.
    """
    need = float(need)
    if need < ALWAYS_FITS and not math.isnan(need) and (
            "QDIFF_MEMORY_LIMIT" not in os.environ or need <= env_limit()):
        return  # a small need under the cap: the system's figures are not read
    have = budget(device)
    if not need <= have:
        where = _device_type(device)
        need_s, have_s = _distinct(need, have)
        raise QdiffMemoryError(f"{what} needs about {need_s} but the memory budget on "
                               f"{where} is {have_s} ({MARGIN:.0%} of the available memory"
                               f"{', capped by QDIFF_MEMORY_LIMIT' if env_limit() else ''})"
                               f"{'; ' + hint if hint else ''}")
