"""Shared by the benchmark scripts: whether a peer is installed here, and argument errors on one
line.

A peer that cannot be imported is reported by name with the reason, once, at the start of the
output; the script then leaves it out (its cells read ``unavailable``) or, where the peer is
the reference every ratio is taken against, stops with that one line (exit status 1).
"""
from __future__ import annotations

import argparse
import importlib
import sys


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line on stderr (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def why_missing(*modules: str) -> str | None:
    """Why one of ``modules`` cannot be imported here (None when every one can)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any import failure makes the peer unavailable
            text = (str(exc).strip().splitlines() or [""])[0]
            return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return None


def check_peers(peers: dict) -> dict:
    """``peers``: label -> module names. Prints one line per peer that cannot be imported and
    returns {label: reason} of those."""
    gone = {}
    for label, modules in peers.items():
        if isinstance(modules, str):
            modules = (modules,)
        reason = why_missing(*modules)
        if reason is not None:
            gone[label] = reason
            print(f"peer {label} unavailable ({reason}): left out of this run", flush=True)
    return gone


def require(prog: str, label: str, *modules: str) -> None:
    """Stop with one line (exit status 1) when the reference peer ``label`` is not available."""
    reason = why_missing(*modules)
    if reason is not None:
        sys.exit(f"{prog}: {label} is required by this benchmark and is unavailable ({reason})")


def circuit_files(ap: argparse.ArgumentParser, directory: str, only=None,
                  pattern: str = "*.qasm") -> list:
    """The files of ``directory`` matching ``pattern``, restricted to the names in ``only``
    (without ``.qasm``); a usage error (exit status 2) when there is none, or when a name of
    ``only`` matches no file."""
    import glob
    import os
    files = sorted(glob.glob(os.path.join(directory, pattern)))
    if not files:
        ap.error(f"--dir {directory}: no {pattern} file there")
    if only:
        names = {os.path.basename(f)[:-5] for f in files}
        unknown = [x for x in only if x not in names]
        if unknown:
            ap.error(f"--only: no {pattern} file named {', '.join(unknown)} in {directory}")
        files = [f for f in files if os.path.basename(f)[:-5] in only]
    return files
