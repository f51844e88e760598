"""Mean ± standard deviation over repeated runs (seeds), one rule for every summary and table.

The standard deviation is the sample one (ddof = 1), as papers reporting "mean ± std over seeds" use. One value has
no sample standard deviation: its `std` is None and its table cell shows the mean alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: the sentence summaries and table notes use for `std`
SAMPLE_STD = "sample standard deviation (ddof=1) over seeds"


def seed_stats(values: Sequence[float]) -> dict[str, Any]:
    """{'mean', 'std' (sample, ddof=1; None for one value), 'values'} of the per-seed values."""
    array = np.asarray(values, dtype=np.float64)
    std = float(array.std(ddof=1)) if len(array) > 1 else None
    return {"mean": float(array.mean()), "std": std, "values": [float(v) for v in array]}


def mean_pm_std(stats: Mapping[str, Any], digits: int = 2) -> str:
    """'mean ± std' of a `seed_stats` dict with `digits` decimals; the mean alone when there is no std (one seed)."""
    mean = f"{stats['mean']:.{digits}f}"
    return mean if stats["std"] is None else f"{mean} ± {stats['std']:.{digits}f}"
