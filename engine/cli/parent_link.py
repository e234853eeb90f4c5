"""An engine started by a parent in a session of its own stops when that parent dies.

`engine demo` starts the engine in its own session, so that Ctrl-C reaches only the demo
(which then stops the engine in order). Killed outright (SIGKILL), the demo could stop
nothing, and the engine ran on alone. The parent names itself in ENGINE_EXIT_WITH_PARENT;
the engine then asks Linux for SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG), and
SIGTERM drains and stops it as it always does.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

EXIT_WITH_PARENT_ENV = "ENGINE_EXIT_WITH_PARENT"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent() -> None:
    parent = os.environ.pop(EXIT_WITH_PARENT_ENV, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)
