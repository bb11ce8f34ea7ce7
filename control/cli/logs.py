"""Where log lines go and which are kept: steersman's own at ``log_level``, the libraries' (httpx's
line per request, uvicorn, APScheduler, transformers) at ``log_libraries``, so an operator's log
holds what they act on rather than every health probe and scrape."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str = "INFO", libraries: str = "WARNING") -> None:
    """Every logger outside ``steersman`` at ``libraries``, steersman's at ``level``.

    >>> configure_logging("INFO", "WARNING")
    >>> logging.getLogger("httpx").isEnabledFor(logging.INFO)
    False
    >>> logging.getLogger("steersman.control.serve.daemon").isEnabledFor(logging.INFO)
    True
    """
    logging.basicConfig(format=FORMAT)
    logging.getLogger().setLevel(libraries)
    logging.getLogger("steersman").setLevel(level)
    for name in list(logging.root.manager.loggerDict):
        logger = logging.getLogger(name)
        # A library that set its own level (uvicorn, transformers) is brought in line too.
        if not name.startswith("steersman") and logger.level != logging.NOTSET:
            logger.setLevel(libraries)
