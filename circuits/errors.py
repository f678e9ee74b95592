"""The error type every user-facing failure of qdiff raises, and the secrets (tokens) scrubbed
from every message.

``QdiffError`` lives in the lowest layer (``qdiff.circuits``) so that every layer can raise it;
``qdiff.QdiffError`` re-exports it.
"""
from typing import Optional

_SECRETS: set = set()


class QdiffError(ValueError):
    """A user error: the message names the file, line, gate, wire or shape at fault."""


class QdiffMemoryError(QdiffError, MemoryError):
    """A simulation would not fit in memory; raised before anything is allocated."""


class QdiffParseError(QdiffError):
    """Malformed circuit text (OpenQASM); the message names the file and line."""


def checked_call(fn):
    """``fn`` with its call checked against its signature first: an unknown keyword, a missing
    or surplus argument is a :class:`QdiffError` naming it and the keywords ``fn`` takes (not
    Python's bare ``TypeError``)."""
    import functools
    import inspect
    sig = inspect.signature(fn)
    names = [p.name for p in sig.parameters.values()
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]
    who = fn.__qualname__.replace(".__init__", "")

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise QdiffError(f"{who}: {exc} (its arguments: {', '.join(names)})") from None
        return fn(*args, **kwargs)
    return call


def register_secret(secret: Optional[str]) -> None:
    """Remember a secret (a token) so that :func:`scrub` removes it from every message."""
    if secret:
        _SECRETS.add(str(secret))


def scrub(text) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    text = str(text)
    for s in _SECRETS:
        text = text.replace(s, "***")
    return text
