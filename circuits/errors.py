"""The error type every user-facing failure of qdiff raises.

``QdiffError`` lives in the lowest layer (``qdiff.circuits``) so that every layer can raise it;
``qdiff.QdiffError`` re-exports it.
"""


class QdiffError(ValueError):
    """A user error: the message names the file, line, gate, wire or shape at fault."""


class QdiffMemoryError(QdiffError, MemoryError):
    """A simulation would not fit in memory; raised before anything is allocated."""


class QdiffParseError(QdiffError):
    """Malformed circuit text (OpenQASM); the message names the file and line."""
