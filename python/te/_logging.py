"""TE_LOG_LEVEL for te's Python loggers ("te", "mooncake"): the same
variable sets the level of the library's own lines (libte reads it), so
one setting quiets or opens both. The application's logging configuration
still decides where Python's lines go and how they look. An unknown value
is left to libte, whose engine creation refuses it naming the variable."""

import logging
import os

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING,
          "error": logging.ERROR, "off": logging.CRITICAL + 10, "none": logging.CRITICAL + 10}


def apply_env_level():
    """Sets the "te" and "mooncake" loggers' level from TE_LOG_LEVEL, when
    it is set to a level te knows; returns that level or None."""
    level = LEVELS.get(os.environ.get("TE_LOG_LEVEL", "").strip().lower())
    if level is not None:
        for name in ("te", "mooncake"):
            logging.getLogger(name).setLevel(level)
    return level
