"""One line when a long phase of work starts and one when it ends, with its duration, so that a run's log never goes
silent for minutes (the evaluations before and after training, MTEB-protocol scoring, the export). On a terminal the
encode loops draw their own progress bars as well (`SentenceEncoder.map_batches`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("hf_sentcl")


@contextmanager
def phase(name: str, detail: str = "") -> Iterator[None]:
    """Log `name` (and `detail`) as the phase starts, and `name done in N s` as it ends (nothing when it fails: the
    error says what happened)."""
    logger.info("%s%s ...", name, f": {detail}" if detail else "")
    start = time.perf_counter()
    yield
    logger.info("%s done in %.1f s.", name, time.perf_counter() - start)
