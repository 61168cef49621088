"""Waits that Python signals can interrupt.

te_wait and te_handoff_wait block in C, where Python cannot run a signal
handler: Ctrl-C (SIGINT) or SIGTERM during a long wait took effect only once
te's own timeout ended it. A wait here is a loop of short C waits; between
them the interpreter runs pending handlers, so KeyboardInterrupt (or the
application's handler) arrives within a slice.
"""

import time

from .errors import error_for

SLICE = 0.1  # seconds per C wait: the most a signal waits to be handled
_TIMEOUT = 8  # TE_ERR_TIMEOUT


def sliced(call, timeout, what):
    """Run call(ms) (a te wait returning 0 or a negative code) until it
    returns anything but TE_ERR_TIMEOUT or timeout seconds (None: no limit)
    passed. Returns the last code; a wait that ran out raises Timeout
    saying what did not finish within timeout."""
    if timeout is not None and timeout <= 0:
        return call(0)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = SLICE if deadline is None else min(SLICE, deadline - time.monotonic())
        rc = call(max(0, int(left * 1000)))
        if rc != -_TIMEOUT:
            return rc
        if deadline is not None and time.monotonic() >= deadline:
            raise error_for(_TIMEOUT, "wait: timeout: %s not finished within %gs" % (what, timeout))
