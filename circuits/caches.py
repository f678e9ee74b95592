"""Every cache in qdiff, registered in one place, and one switch that clears them all.

A cache here holds only what is derived from structure (a gate's shift rule, a template's
block layout, a circuit's native encoding, sign matrices), never a result that couples one call
to the next: what a backward pass needs from its forward pass travels on the autograd context.
Tensors a cache keeps are made under :func:`constants`: plain tensors without autograd history,
never wrapped by the torch.func transform (``grad``, ``jacfwd``, ``vmap``, ...) that happened
to be active when the cache was filled, so later calls, transformed or not, can use them.
:func:`clear` (``qdiff.clear_caches()``) empties every registered cache and invalidates the
plans memoised on circuit objects (:func:`qdiff.circuits.circuit.memo`); results are the same
before and after, only slower to get once.

Threads share these caches, and :func:`clear` may run while other threads read and fill them:
read an entry once (:func:`fetch`) and evict with :func:`trim`, never test for a key and then
index it.

>>> from qdiff.circuits import caches
>>> @caches.cached(maxsize=8)
... def square(x):
...     return x * x
>>> square(3), "square" in " ".join(caches.names())
(9, True)
>>> caches.clear(); square.cache_info().currsize
0
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch

_CLEARERS: dict = {}
_MISSING = object()
_generation = 0  # bumped by clear(): memo entries of an older generation are stale


def register(name: str, cache, clear: Callable = None):
    """Register ``cache`` (a dict-like with ``clear()``, or anything when ``clear`` is given)
    under ``name``; returns ``cache`` so that a module can write
    ``_PLANS = caches.register("native.plans", {})``."""
    _CLEARERS[name] = clear if clear is not None else cache.clear
    return cache


try:
    _disable_functorch = torch._C._DisableFuncTorch
except AttributeError:  # torch without torch.func
    _disable_functorch = contextlib.nullcontext


@contextlib.contextmanager
def constants():
    """Tensors made in this block are plain constants fit to keep across calls: no autograd
    history, not inference tensors (a value first built under ``torch.inference_mode`` serves
    later differentiated calls), and not wrapped by an active torch.func transform. Only for
    values built from structure (Python data, dtypes, devices), never from a call's input
    tensors."""
    with torch.inference_mode(False), torch.no_grad(), _disable_functorch():
        yield


@contextlib.contextmanager
def outside_legacy_vmap():
    """The block runs outside torch's legacy vmap mode, where random draws (shots, SPSA
    directions) are refused. ``torch.autograd.functional.jacobian(..., vectorize=True,
    strategy="forward-mode")`` runs the whole function in that mode with only its tangents
    batched: a draw from plain tensors there is one draw, as without the Jacobian."""
    depth = 0
    while torch._C._vmapmode_decrement_nesting() >= 0:
        depth += 1
    torch._C._vmapmode_increment_nesting()  # the last step went below zero: back to it
    try:
        yield
    finally:
        for _ in range(depth):
            torch._C._vmapmode_increment_nesting()


def cached(maxsize=None):
    """``functools.lru_cache(maxsize)`` that registers itself under the function's
    ``module.qualname``; the function runs under :func:`constants`."""
    def deco(fn):
        @functools.wraps(fn)
        def build(*args, **kwargs):
            with constants():
                return fn(*args, **kwargs)
        wrapped = functools.lru_cache(maxsize=maxsize)(build)
        register(f"{fn.__module__}.{fn.__qualname__}", wrapped, wrapped.cache_clear)
        return wrapped
    return deco


def fetch(cache, key, build: Callable):
    """``cache[key]``, or ``build()`` (run under :func:`constants`) stored there on a miss.
    The entry is read once, so another thread clearing or trimming the cache meanwhile costs a
    rebuild, never a ``KeyError``.

    >>> fetch({}, "k", lambda: 1)
    1
    """
    val = cache.get(key, _MISSING)
    if val is _MISSING:
        with constants():
            val = build()
        cache[key] = val
    return val


def trim(cache, size: int) -> None:
    """Drop the oldest entries of ``cache`` (a dict or ``OrderedDict``, oldest first) until at
    most ``size`` are left; entries another thread removed meanwhile are skipped.

    >>> d = {1: "a", 2: "b", 3: "c"}; trim(d, 1); d
    {3: 'c'}
    """
    while len(cache) > size:
        try:
            cache.pop(next(iter(cache)))
        except (KeyError, StopIteration, RuntimeError):  # changed by another thread: look again
            continue


def generation() -> int:
    """The current cache generation (memoised plans record the one they were built in)."""
    return _generation


def clear() -> None:
    """Empty every registered cache and invalidate memoised circuit plans."""
    global _generation
    _generation += 1
    for fn in list(_CLEARERS.values()):
        fn()


def names() -> list:
    """The registered caches' names, sorted."""
    return sorted(_CLEARERS)
