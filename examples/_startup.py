"""Imported first by every example script run as a program: a Ctrl-C that lands while the
script's imports run (torch, qdiff, PennyLane: a second or more) is one line on stderr and exit
code 130, as it is later, instead of a traceback. Nothing has been written yet at that point.
:func:`_cli.run` hands SIGINT back to Python before the script's ``main`` runs."""
import os
import signal
import sys


def _interrupted(signum, frame):  # pragma: no cover - runs in the interrupted process
    prog = os.path.basename(sys.argv[0]) or "example"
    os.write(2, f"{prog}: error: interrupted\n".encode())
    os._exit(130)


signal.signal(signal.SIGINT, _interrupted)
