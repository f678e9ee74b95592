"""Running primitive jobs: counting, retries with backoff, status and progress, a timeout, and
errors mapped to :class:`QdiffError` with any registered secret (an IBM token) scrubbed out.

Works with anything shaped like a Qiskit job: ``status()`` (a ``JobStatus`` or a string such
as ``"QUEUED"``), ``result()``, ``job_id()``, and optionally ``cancel()``/``error_message()``.

>>> r = JobRunner("demo")
>>> class Done:
...     def status(self): return "DONE"
...     def result(self): return 42
...     def job_id(self): return "j1"
>>> r.run(lambda: Done()), r.jobs_submitted
(42, 1)
"""
from __future__ import annotations

import logging
import math
import numbers
import sys
import time
from typing import Callable, Optional

from qdiff.circuits.errors import QdiffError, scrub

log = logging.getLogger("qdiff.backends")

FINAL = ("DONE", "ERROR", "CANCELLED")
_TRANSIENT_NAMES = {"ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout",
                    "ChunkedEncodingError", "RemoteDisconnected", "ProtocolError"}
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


def status_name(job) -> str:
    """``"QUEUED"``, ``"RUNNING"``, ``"DONE"``, ... from a JobStatus enum or a string."""
    st = job.status()
    return str(getattr(st, "name", st)).upper()


def is_transient(exc: BaseException) -> bool:
    """Network hiccups and 408/429/5xx answers: worth retrying; anything else is not."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    code = getattr(exc, "status_code", None)
    if code in _TRANSIENT_STATUS:
        return True
    return any(c.__name__ in _TRANSIENT_NAMES for c in type(exc).__mro__)


class JobRunner:
    """Submits jobs and waits for them.

    Args:
        label: names the backend in messages (``"ibm fake_manila"``).
        timeout: seconds to wait for one job before cancelling it (None: no limit).
        max_retries: submissions retried after a transient failure.
        backoff: first retry delay in seconds, doubled after each retry.
        progress: ``True`` prints every status change to stderr, ``"auto"`` only once a job
            has run longer than ``progress_after`` seconds, ``False`` never (logging only).
    """

    def __init__(self, label: str, timeout: Optional[float] = None, max_retries: int = 3,
                 backoff: float = 1.0, progress="auto", progress_after: float = 10.0,
                 sleep: Callable = time.sleep, clock: Callable = time.monotonic):
        if timeout is not None and not (_is_real(timeout) and 0 < timeout < math.inf):
            raise QdiffError(f"timeout must be positive seconds or None; got {timeout!r}")
        if not (isinstance(max_retries, numbers.Integral) and not isinstance(max_retries, bool)
                and max_retries >= 0):
            raise QdiffError(f"max_retries must be an integer >= 0; got {max_retries!r}")
        if not (_is_real(backoff) and 0 <= backoff < math.inf):
            raise QdiffError(f"backoff must be seconds >= 0; got {backoff!r}")
        if progress not in (True, False, "auto") or not isinstance(progress, (bool, str)):
            raise QdiffError(f"progress must be True, False or 'auto'; got {progress!r}")
        if not (_is_real(progress_after) and 0 <= progress_after < math.inf):
            raise QdiffError(f"progress_after must be seconds >= 0; got {progress_after!r}")
        self.label = label
        self.timeout = timeout
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.progress = progress
        self.progress_after = progress_after
        self._sleep, self._clock = sleep, clock
        self.jobs_submitted = 0
        self.job_ids: list = []

    def run(self, submit: Callable):
        """Submit with ``submit()`` (retrying transient failures), wait, return the result."""
        job = self.submit(submit)
        self.wait(job)
        return self.result(job)

    def submit(self, submit: Callable):
        delay = self.backoff
        for attempt in range(self.max_retries + 1):
            message = None
            try:
                job = submit()
            except QdiffError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is mapped below
                if is_transient(exc) and attempt < self.max_retries:
                    log.warning("%s: submission failed (%s); retry %d/%d in %.1f s", self.label,
                                scrub(type(exc).__name__), attempt + 1, self.max_retries, delay)
                    self._sleep(delay)
                    delay *= 2
                    continue
                message = (f"{self.label}: job submission failed"
                           f"{' after retries' if attempt else ''}: "
                           f"{type(exc).__name__}: {scrub(exc)}")
            if message is not None:
                # raised outside the handler: no __context__ holding the unscrubbed original
                raise QdiffError(message)
            self.jobs_submitted += 1
            self.job_ids = (self.job_ids + [_job_id(job)])[-100:]
            return job

    def wait(self, job) -> str:
        start = self._clock()
        last = None
        while True:
            st = self._poll(job)
            elapsed = self._clock() - start
            if st != last:
                self._report(job, st, elapsed)
                last = st
            if st in FINAL:
                return st
            if self.timeout is not None and elapsed > self.timeout:
                fate = ("it was cancelled" if _try_cancel(job) else
                        "cancelling it failed, so it may still run")
                raise QdiffError(f"{self.label}: job {_job_id(job)} did not finish within "
                                 f"{self.timeout:g} s (last status {st}); {fate}")
            # poll at ~10% of the time waited so far: local jobs (a second or two) are not
            # overslept, hardware jobs (minutes in a queue) are not polled every few ms
            delay = min(max(0.01, 0.1 * elapsed), 2.0)
            self._sleep(delay)

    def _poll(self, job) -> str:
        """The job's status; transient failures of the status query (network) are retried
        like submissions, others are a QdiffError."""
        delay = self.backoff
        for attempt in range(self.max_retries + 1):
            message = None
            try:
                return status_name(job)
            except Exception as exc:  # noqa: BLE001 - mapped below
                if is_transient(exc) and attempt < self.max_retries:
                    log.warning("%s: status query failed (%s); retry %d/%d in %.1f s",
                                self.label, type(exc).__name__, attempt + 1, self.max_retries,
                                delay)
                    self._sleep(delay)
                    delay *= 2
                    continue
                message = (f"{self.label}: could not get the status of job {_job_id(job)}"
                           f"{' after retries' if attempt else ''}: {type(exc).__name__}: "
                           f"{scrub(exc)}")
            raise QdiffError(message)  # outside the handler: no __context__ (see submit)

    def result(self, job):
        st = self._poll(job)  # (retried, and a failure scrubbed, as while waiting)
        jid = _job_id(job)
        if st == "CANCELLED":
            raise QdiffError(f"{self.label}: job {jid} was cancelled")
        if st == "ERROR":
            msg = _error_message(job)
            raise QdiffError(f"{self.label}: job {jid} failed: {scrub(msg)}")
        try:
            return job.result()
        except Exception as exc:  # noqa: BLE001
            message = f"{self.label}: job {jid} failed: {type(exc).__name__}: {scrub(exc)}"
        raise QdiffError(message)  # outside the handler: no __context__ (see submit)

    def _report(self, job, st: str, elapsed: float):
        line = f"[qdiff] {self.label} job {_job_id(job)}: {st} ({elapsed:.0f} s)"
        log.info(line)
        if self.progress is True or (self.progress == "auto" and elapsed > self.progress_after):
            print(line, file=sys.stderr, flush=True)


def _job_id(job) -> str:
    try:
        return str(job.job_id())
    except Exception:  # noqa: BLE001 - an id is only for messages
        return "?"


def _try_cancel(job) -> bool:
    """Ask for the job's cancellation; False where that failed (the timeout error says so):
    ``cancel()`` raised, or returned False (a local testing-mode job already running: its
    future cannot be cancelled and the simulation goes on)."""
    try:
        accepted = job.cancel()
    except Exception:  # noqa: BLE001 - best effort; the timeout error follows anyway
        accepted = False
    if accepted is False:
        log.warning("could not cancel job %s", _job_id(job))
        return False
    return True


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _error_message(job) -> str:
    getter = getattr(job, "error_message", None)
    if getter is not None:
        try:
            msg = getter()
            if msg:
                return str(msg)
        except Exception:  # noqa: BLE001
            pass
    try:
        job.result()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return "unknown error"
