"""Checks shared by the recipe dataclasses: choices read from `Literal` type hints, number ranges, and the
Matryoshka sizes (also checked against the embedding's width once the model is known).

The parser (`HfArgumentParser`) already refuses a value outside a `Literal`'s choices; `check_choices` applies the
same rule to configs built directly in Python, so the choices are written once, in the type.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal


@functools.cache
def literal_choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """{field name: its choices} for every field of dataclass `cls` typed `Literal[...]` (or `Literal[...] | None`)."""
    hints = typing.get_type_hints(cls)
    choices = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        literals = [option for option in options if typing.get_origin(option) is Literal]
        if literals:
            choices[f.name] = typing.get_args(literals[0])
    return choices


def check_choices(config: Any) -> None:
    """Raise ValueError naming the first `Literal`-typed field of `config` whose value is not one of its choices."""
    for name, choices in literal_choices(type(config)).items():
        value = getattr(config, name)
        if value is not None and value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got '{value}'.")


def check_range(
    name: str,
    value: float | None,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    hint: str = "",
) -> None:
    """Raise ValueError naming `name` unless `value` is None or a finite number inside the interval.

    `low_open`/`high_open` exclude the bound itself; `hint` is appended to the message (what to do).
    """
    if value is None:
        return
    left = "(" if low_open else "["
    right = ")" if high_open or high is None else "]"
    interval = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
    inside = math.isfinite(value) and not (
        (low is not None and (value < low or (low_open and value == low)))
        or (high is not None and (value > high or (high_open and value == high)))
    )
    if not inside:
        raise ValueError(f"{name} must be a finite number in {interval}, got {value}.{' ' + hint if hint else ''}")


def check_matryoshka(dims: Sequence[int] | None, weights: Sequence[float] | None, width: int | None = None) -> None:
    """Raise ValueError naming `matryoshka_dims` / `matryoshka_weights` when they do not describe prefixes:
    positive, distinct sizes (at most `width`, the embedding size, when known) and one positive weight each."""
    if dims is None:
        if weights is not None:
            raise ValueError("matryoshka_weights is set without matryoshka_dims; set both or neither.")
        return
    dims = list(dims)
    if not dims or any(not isinstance(d, int) or d < 1 for d in dims):
        raise ValueError(
            f"matryoshka_dims must be a non-empty list of positive sizes, e.g. [384, 256, 128, 64]; got {dims}."
        )
    if len(set(dims)) != len(dims):
        raise ValueError(f"matryoshka_dims lists a size twice: {dims}.")
    if width is not None and max(dims) > width:
        raise ValueError(
            f"matryoshka_dims: {max(dims)} is larger than the embedding ({width} dimensions); use sizes <= {width}."
        )
    if weights is not None and (len(weights) != len(dims) or any(w <= 0 for w in weights)):
        raise ValueError(
            f"matryoshka_weights must give one positive weight per matryoshka_dims entry ({len(dims)}); "
            f"got {list(weights)}."
        )
