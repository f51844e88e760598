"""Small argv helpers shared by the command lines: comma-separated lists and options taken out of an argv."""

from __future__ import annotations


def split_commas(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']: the stripped, non-empty items of a comma-separated list."""
    return [item.strip() for item in str(text).split(",") if item.strip()]


def parse_ints(text: str, option: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3] (an empty list for ''); ValueError naming `option` when an item is not an integer."""
    try:
        return [int(item) for item in split_commas(text)]
    except ValueError:
        raise ValueError(f"{option} expects comma-separated integers such as 1,2,3, got '{text}'.") from None


def pop_option(args: list[str], name: str) -> str | None:
    """Remove the first `NAME VALUE` or `NAME=VALUE` from `args` (in place) and return VALUE; None when absent."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
            del args[i : i + 2]
            return value
        if arg.startswith(name + "="):
            del args[i]
            return arg.split("=", 1)[1]
    return None


def has_option(args: list[str], name: str) -> bool:
    """Whether `args` holds `NAME` or `NAME=...`."""
    return any(arg == name or arg.startswith(name + "=") for arg in args)
