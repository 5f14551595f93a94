"""vans' log records in Python's ``logging``: the Rust code's records arrive under the logger
``vans`` (``vans.node.member``, ``vans.van_tcp.van``, ...) through a daemon thread.

What is kept follows the more verbose of ``PS_VERBOSE`` (unset: warnings, 1: info, 2: debug)
and the ``vans`` logger's level (``logging.getLogger("vans").setLevel(logging.INFO)`` works
as ``PS_VERBOSE=1`` does). With ``PS_VERBOSE`` set and no handler configured anywhere, a
handler writing to stderr is added, so the records show as ps-lite users expect."""

import logging
import os
import sys
import threading

from . import _native

_LOGGER = logging.getLogger("vans")
_started = False


def _pump():
    while True:
        records, dropped = _native._next_log_records(0.5)
        _native._set_log_level(_LOGGER.getEffectiveLevel())
        for level, target, message in records:
            logging.getLogger(f"vans.{target}").log(level, message)
        if dropped:
            _LOGGER.warning("%d log records were dropped (the queue was full)", dropped)


def start():
    """Starts the thread that hands records to ``logging`` (once per process)."""
    global _started
    if _started:
        return
    _started = True
    verbose = _native._verbose_level()
    if os.environ.get("PS_VERBOSE") and not _LOGGER.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        _LOGGER.addHandler(handler)
        _LOGGER.setLevel(verbose)
    _native._set_log_level(_LOGGER.getEffectiveLevel())
    threading.Thread(target=_pump, name="vans-logging", daemon=True).start()
