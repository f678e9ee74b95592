"""Core-to-core handoff time: two threads pinned to two of this process's CPUs pass a cache line
back and forth, and the round trip in nanoseconds is printed. On one die (cores sharing a
last-level cache) a round trip takes about 100 ns; between dies or sockets 3-4x that, and a
state split over threads on such cores pays for every line one thread writes and the other
then reads. A virtual machine's cores may move between those placements while it runs, so the
thread-scaling benchmark measures this before and after each of its rounds.

    python bench/handoff.py            # round trip between the first two CPUs, in ns
"""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile

SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <time.h>
static _Atomic long flag __attribute__((aligned(64)));
static long rounds;
static int cpu_a, cpu_b;
static void pin(int c) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}
static void *other(void *arg) {
    (void)arg;
    pin(cpu_b);
    for (long i = 0;; i++) {
        long f;
        while ((f = atomic_load_explicit(&flag, memory_order_acquire)) != 2 * i + 1)
            if (f < 0) return 0;
        atomic_store_explicit(&flag, 2 * i + 2, memory_order_release);
    }
}
static double since(const struct timespec *a) {
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (b.tv_sec - a->tv_sec) * 1e9 + (b.tv_nsec - a->tv_nsec);
}
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    cpu_a = atoi(argv[1]); cpu_b = atoi(argv[2]); rounds = atol(argv[3]);
    pthread_t t;
    pin(cpu_a);
    pthread_create(&t, 0, other, 0);
    struct timespec a;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long i = 0;
    double ns = 0;
    /* at most 100 ms: a core busy with other work answers once per time slice */
    for (; i < rounds && (i % 1024 || (ns = since(&a)) < 1e8); i++) {
        atomic_store_explicit(&flag, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 2) {}
    }
    ns = since(&a);
    atomic_store_explicit(&flag, -1, memory_order_release);
    pthread_join(t, 0);
    printf("%.1f\n", i ? ns / i : 1e9);
    return 0;
}
"""

@functools.lru_cache(maxsize=None)
def _build() -> str | None:
    """The compiled program (once per process; None without a C compiler)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    d = tempfile.mkdtemp(prefix="qdiff-handoff-")
    atexit.register(shutil.rmtree, d, True)
    src, out = os.path.join(d, "handoff.c"), os.path.join(d, "handoff")
    with open(src, "w") as fh:
        fh.write(SOURCE)
    ok = subprocess.run([cc, "-O2", "-pthread", src, "-o", out], capture_output=True)
    return out if ok.returncode == 0 else None


BUSY_NS = 5000  # a round trip above this: one of the cores was running something else


def round_trip_ns(rounds: int = 200_000) -> float | None:
    """Round trip of a cache line between the first two CPUs this process may run on, in ns
    (at most ``rounds`` round trips or 100 ms). None without a C compiler, with fewer than two
    CPUs, or when a core was busy with other work (a round trip above ``BUSY_NS``)."""
    cpus = sorted(os.sched_getaffinity(0))
    exe = _build()
    if exe is None or len(cpus) < 2:
        return None
    try:
        out = subprocess.run([exe, str(cpus[0]), str(cpus[1]), str(rounds)],
                             capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    ns = float(out.stdout)
    return ns if ns <= BUSY_NS else None


if __name__ == "__main__":
    from benchutil import ArgumentParser
    ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    ns = round_trip_ns()
    print("not measured (no C compiler, fewer than two CPUs, or a core busy with other work)"
          if ns is None else f"{ns:.0f} ns")
