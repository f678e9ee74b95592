"""Entry point of the ``qdiff`` console script (``[project.scripts]``).

The console script imports this small module, then :func:`main` imports the command line
(:mod:`qdiff.cli`): a Ctrl-C that lands while that import runs is one line on stderr and exit
130, as everywhere later, instead of a traceback and death by the signal.
"""
from __future__ import annotations

import signal
import sys

EXIT_INTERRUPT = 130


def main(argv=None) -> int:
    try:
        from qdiff.cli import main as cli_main
        return cli_main(argv)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the line
        sys.stderr.write("qdiff: error: interrupted; no partial output was written\n")
        sys.stderr.flush()
        return EXIT_INTERRUPT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
