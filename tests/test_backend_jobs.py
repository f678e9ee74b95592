"""Job handling shared by the Aer and IBM backends: retries with backoff, timeout and cancel,
failed/cancelled jobs, progress lines, secret scrubbing (fake job objects; no network)."""
from __future__ import annotations

import pytest
import torch

import qdiff as qd
from qdiff import QdiffError
from qdiff.backends.runtime_jobs import JobRunner, is_transient
from qdiff.circuits.errors import register_secret, scrub


class FakeJob:
    """Walks through ``statuses`` (one per status() call, the last one repeats)."""

    def __init__(self, statuses, result=42, error=None, jid="job-1"):
        self.statuses = list(statuses)
        self._result, self._error, self.jid = result, error, jid
        self.cancelled = False

    def status(self):
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def result(self):
        if self._error:
            raise RuntimeError(self._error)
        return self._result

    def job_id(self):
        return self.jid

    def cancel(self):
        self.cancelled = True
        self.statuses = ["CANCELLED"]

    def error_message(self):
        return self._error


class Clock:
    def __init__(self):
        self.t = 0.0
        self.sleeps = []

    def sleep(self, s):
        self.sleeps.append(s)
        self.t += s

    def now(self):
        return self.t


def runner(**kw):
    c = Clock()
    return JobRunner("test backend", sleep=c.sleep, clock=c.now, **kw), c


def test_waits_until_done_and_counts_jobs():
    r, c = runner()
    assert r.run(lambda: FakeJob(["QUEUED", "RUNNING", "RUNNING", "DONE"])) == 42
    assert r.run(lambda: FakeJob(["DONE"], result=7)) == 7
    assert r.jobs_submitted == 2 and r.job_ids == ["job-1", "job-1"]
    assert len(c.sleeps) == 3  # one poll per non-final status


def test_jobstatus_enums_are_understood():
    from qiskit.providers import JobStatus
    r, _ = runner()
    assert r.run(lambda: FakeJob([JobStatus.RUNNING, JobStatus.DONE])) == 42


def test_timeout_cancels_the_job_and_names_it():
    r, c = runner(timeout=5)
    job = FakeJob(["QUEUED"], jid="slow-9")
    with pytest.raises(QdiffError, match=r"slow-9 did not finish within 5 s \(last status QUEUED\)"):
        r.run(lambda: job)
    assert job.cancelled and c.t > 5


def test_failed_job_reports_the_error_message():
    r, _ = runner()
    with pytest.raises(QdiffError, match="job-1 failed: calibration error on qubit 3"):
        r.run(lambda: FakeJob(["RUNNING", "ERROR"], error="calibration error on qubit 3"))


def test_cancelled_job_is_an_error():
    r, _ = runner()
    with pytest.raises(QdiffError, match="job-1 was cancelled"):
        r.run(lambda: FakeJob(["CANCELLED"]))


def test_result_exception_becomes_qdiff_error():
    r, _ = runner()
    with pytest.raises(QdiffError, match="RuntimeError: boom"):
        r.run(lambda: FakeJob(["DONE"], error="boom"))


def test_transient_submission_failures_are_retried_with_backoff():
    r, c = runner(max_retries=3, backoff=0.5)
    calls = []

    def submit():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("connection reset")
        return FakeJob(["DONE"])
    assert r.run(submit) == 42
    assert len(calls) == 3 and c.sleeps[:2] == [0.5, 1.0]
    assert r.jobs_submitted == 1


def test_retries_give_up_with_a_clear_error():
    r, c = runner(max_retries=2, backoff=1.0)

    def submit():
        raise TimeoutError("read timed out")
    with pytest.raises(QdiffError, match="submission failed after retries: TimeoutError"):
        r.run(submit)
    assert c.sleeps == [1.0, 2.0] and r.jobs_submitted == 0


def test_permanent_submission_failure_is_not_retried():
    r, c = runner(max_retries=5)
    calls = []

    def submit():
        calls.append(1)
        raise ValueError("circuit is not ISA")
    with pytest.raises(QdiffError, match="submission failed: ValueError: circuit is not ISA"):
        r.run(submit)
    assert len(calls) == 1 and c.sleeps == []


def test_transient_classification():
    class RequestsApiError(Exception):
        status_code = 503

    class Forbidden(Exception):
        status_code = 403
    assert is_transient(ConnectionError()) and is_transient(RequestsApiError())
    assert not is_transient(Forbidden()) and not is_transient(ValueError())


def test_progress_lines_go_to_stderr(capsys):
    r, _ = runner(progress=True)
    r.run(lambda: FakeJob(["QUEUED", "RUNNING", "DONE"], jid="abc"))
    err = capsys.readouterr().err
    assert "test backend job abc: QUEUED" in err and "job abc: DONE" in err
    r2, _ = runner(progress=False)
    r2.run(lambda: FakeJob(["QUEUED", "DONE"]))
    assert capsys.readouterr().err == ""


def test_registered_secrets_are_scrubbed_from_errors():
    secret = "tok-SECRET-123456"
    register_secret(secret)
    assert scrub(f"bad token {secret}!") == "bad token ***!"
    r, _ = runner(max_retries=0)

    def submit():
        raise RuntimeError(f"401 for token {secret}")
    with pytest.raises(QdiffError) as info:
        r.run(submit)
    assert secret not in str(info.value) and "***" in str(info.value)
    with pytest.raises(QdiffError) as info:
        r.run(lambda: FakeJob(["ERROR"], error=f"auth {secret}"))
    assert secret not in str(info.value)


def test_scrubbed_errors_keep_no_unscrubbed_context():
    """The original exception (its text holds the secret) is neither the cause nor the
    context of the QdiffError raised for it."""
    secret = "tok-SECRET-context-42"
    register_secret(secret)
    r, _ = runner(max_retries=0)

    def submit():
        raise RuntimeError(f"401 for token {secret}")

    class ResultFails(FakeJob):
        def result(self):
            raise RuntimeError(f"expired token {secret}")

    for call in (lambda: r.run(submit), lambda: r.run(lambda: ResultFails(["DONE"]))):
        with pytest.raises(QdiffError) as info:
            call()
        assert "***" in str(info.value)
        assert info.value.__cause__ is None and info.value.__context__ is None


def test_bad_runner_options():
    with pytest.raises(QdiffError, match="timeout"):
        JobRunner("x", timeout=0)
    with pytest.raises(QdiffError, match="max_retries"):
        JobRunner("x", max_retries=-1)


@pytest.mark.parametrize("kw", [{"timeout": float("nan")}, {"timeout": "5"}, {"timeout": [1]},
                                {"max_retries": 1.5}, {"max_retries": "3"},
                                {"backoff": -1}, {"backoff": "x"}, {"progress": "yes"},
                                {"progress_after": float("nan")}])
def test_malformed_runner_options_are_refused_not_ignored(kw):
    """A NaN timeout would never fire, 1.5 retries would be one: refused, naming the option."""
    with pytest.raises(QdiffError, match=next(iter(kw))):
        JobRunner("x", **kw)
    import qdiff as qd
    with pytest.raises(QdiffError, match=next(iter(kw))):
        qd.device("aer", wires=1, **kw)


class FlakyStatus(FakeJob):
    """status() fails ``failures`` times with ``exc`` before answering."""

    def __init__(self, statuses, exc, failures):
        super().__init__(statuses)
        self.exc, self.failures = exc, failures

    def status(self):
        if self.failures:
            self.failures -= 1
            raise self.exc
        return super().status()


def test_status_query_failures_are_retried_or_reported():
    r, c = runner(max_retries=2, backoff=1.0)
    assert r.run(lambda: FlakyStatus(["RUNNING", "DONE"], ConnectionError("reset"), 2)) == 42
    assert c.sleeps[:2] == [1.0, 2.0]
    r, _ = runner(max_retries=1)
    with pytest.raises(QdiffError, match="could not get the status of job job-1 after "
                                         "retries: ConnectionError"):
        r.run(lambda: FlakyStatus(["DONE"], ConnectionError("reset"), 5))
    with pytest.raises(QdiffError, match="could not get the status of job job-1: KeyError"):
        r.run(lambda: FlakyStatus(["DONE"], KeyError("status"), 1))


def test_timeout_says_when_the_cancellation_failed():
    class Stuck(FakeJob):
        def cancel(self):
            raise RuntimeError("cancel refused")

    r, _ = runner(timeout=5)
    with pytest.raises(QdiffError, match="cancelling it failed, so it may still run"):
        r.run(lambda: Stuck(["QUEUED"]))
    r, _ = runner(timeout=5)
    with pytest.raises(QdiffError, match="it was cancelled"):
        r.run(lambda: FakeJob(["QUEUED"]))


def test_timeout_says_when_a_running_local_job_could_not_be_cancelled():
    """A local testing-mode job's cancel() returns False once it runs (its future cannot be
    cancelled): the error says it may still run, not that it was cancelled."""
    class Running(FakeJob):
        def cancel(self):
            return False

    r, _ = runner(timeout=5)
    with pytest.raises(QdiffError, match="cancelling it failed, so it may still run"):
        r.run(lambda: Running(["RUNNING"]))


def test_timeout_of_a_running_fake_device_job_is_not_reported_cancelled():
    dev = qd.device("ibm", backend="fake_manila", wires=2, shots=20000, seed=1, timeout=0.01)
    f = qd.qnode(dev)(lambda x: (qd.RX(x, wires=0), qd.CNOT([0, 1]),
                                 qd.expval(qd.Z(0) @ qd.Z(1)))[2])
    with pytest.raises(QdiffError, match="did not finish within 0.01 s .*(it was cancelled|"
                                         "cancelling it failed, so it may still run)") as info:
        f(torch.rand(30, dtype=torch.float64))
    last = str(info.value).split("last status ")[1]
    if last.startswith("RUNNING"):
        assert "may still run" in last


@pytest.mark.parametrize("transient", [True, False])
def test_status_query_of_the_result_step_is_retried_and_scrubbed(transient):
    """The status read again before fetching the result goes through the same retries and
    scrubbing as the waiting: a transient failure there is retried, a permanent one is a
    QdiffError without the secret (nor an unscrubbed context)."""
    secret = "TOKSECRET_result_status_77"
    register_secret(secret)

    class Job:
        calls = 0

        def status(self):
            Job.calls += 1
            if Job.calls == 2:  # the wait's poll succeeds; the result step's query fails
                exc = ConnectionError if transient else RuntimeError
                raise exc(f"reset while sending 'Authorization: Bearer {secret}'")
            return "DONE"

        def result(self):
            return "RESULT"

        def job_id(self):
            return "job-1"
    runner = JobRunner("ibm test", backoff=0.0)
    if transient:
        assert runner.run(Job) == "RESULT"
        return
    with pytest.raises(QdiffError) as err:
        runner.run(Job)
    assert secret not in str(err.value) and err.value.__context__ is None
    assert "could not get the status of job job-1" in str(err.value)
