"""nixl.logging: NIXL's logger helper.

get_logger(name) returns the standard logging.Logger of that name, given
(once) a handler that writes "NIXL LEVEL file:line message" to stderr at the
level of NIXL_LOG_LEVEL (TRACE, DEBUG, INFO, WARN, ERROR, FATAL; default
INFO), unless the application configured that logger itself.
"""

import logging as _logging
import os as _os

_LEVELS = {
    "TRACE": _logging.DEBUG,
    "DEBUG": _logging.DEBUG,
    "INFO": _logging.INFO,
    "WARN": _logging.WARNING,
    "WARNING": _logging.WARNING,
    "ERROR": _logging.ERROR,
    "FATAL": _logging.CRITICAL,
}


def level():
    """The level NIXL_LOG_LEVEL asks for (INFO when unset or unknown)."""
    return _LEVELS.get(_os.environ.get("NIXL_LOG_LEVEL", "INFO").strip().upper(), _logging.INFO)


def get_logger(name=None):
    logger = _logging.getLogger(name if name else "nixl")
    if not logger.handlers and not getattr(logger, "_nixl_configured", False):
        h = _logging.StreamHandler()
        h.setFormatter(_logging.Formatter("NIXL %(levelname)-7s %(filename)s:%(lineno)d %(message)s"))
        logger.addHandler(h)
        if logger.level == _logging.NOTSET:
            logger.setLevel(level())
        logger.propagate = False
        logger._nixl_configured = True
    return logger
