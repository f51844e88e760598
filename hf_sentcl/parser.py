"""Recipe parsing: one flat YAML file, then `--key value` overrides, mapped onto dataclasses.

Every key must belong to one of the dataclasses; values are coerced to the field's type with a message that
names the key and the file when that is impossible. All of this happens before any model or data is loaded.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hf_sentcl.configs import DataArguments, ModelArguments
from hf_sentcl.trainers.registry import METHODS, get_method

RECIPE_ONLY_KEYS = ("method",)
#: two ways of saying how large the batch is; set on the command line, either replaces the other from the file
BATCH_SIZE_KEYS = ("global_train_batch_size", "per_device_train_batch_size")


class RecipeError(ValueError):
    """A recipe or command-line override that cannot be used; the message names the key at fault."""


class _RecipeLoader(yaml.SafeLoader):
    """YAML with 1.2 booleans: only true/false are booleans, so `eval_strategy: no` stays the string 'no'.

    Boolean fields still accept yes/no/on/off: `coerce` converts those strings.
    """


_RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _load_yaml_text(text: str) -> Any:
    return yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 - a SafeLoader subclass


@dataclasses.dataclass
class Recipe:
    """A parsed recipe: the method name and one instance of each argument dataclass."""

    method: str
    model: ModelArguments
    data: DataArguments
    training: Any  # the method's SentCLTrainingArguments subclass
    source: str | None = None
    #: keys the recipe file, the command line or the caller set (the rest are dataclass defaults)
    explicit_keys: frozenset[str] = frozenset()


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def coerce(value: Any, hint: Any, key: str, where: str) -> Any:
    """Convert a YAML/CLI value to the type `hint`, or raise `RecipeError` naming `key`."""
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    if value is None:
        if type(None) in options or hint is Any:
            return None
        raise RecipeError(f"{where}: key '{key}' must not be empty (expected {_type_name(hint)}).")
    for option in options:
        converted = _try_convert(value, option)
        if converted is not _FAIL:
            return converted
    raise RecipeError(
        f"{where}: key '{key}' expects {_type_name(hint)}, got {value!r} ({type(value).__name__})."
    )


_FAIL = object()
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _try_convert(value: Any, option: Any) -> Any:
    origin = typing.get_origin(option) or option
    if option is Any:
        return value
    if option is type(None):
        return _FAIL
    if origin is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        return _FAIL
    if origin is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                return _FAIL
        return _FAIL
    if origin is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return _FAIL
        return _FAIL
    if isinstance(origin, type) and issubclass(origin, enum.Enum):
        try:
            return origin(value)
        except ValueError:
            return _FAIL
    if origin is str:
        return value if isinstance(value, str) else _FAIL
    if origin in (list, Sequence, tuple):
        if isinstance(value, list):
            items = value
        elif isinstance(value, str):
            items = value.split(",")
        else:  # one scalar (`--view_layers 6`) is a one-element list
            items = [value]
        (inner,) = typing.get_args(option)[:1] or (Any,)
        converted = [_try_convert(item, inner) for item in items]
        return _FAIL if any(c is _FAIL for c in converted) else converted
    if origin is dict:
        if isinstance(value, dict):
            return value
        if isinstance(value, str):
            loaded = _load_yaml_text(value)
            return loaded if isinstance(loaded, dict) else _FAIL
        return _FAIL
    return value if isinstance(origin, type) and isinstance(value, origin) else _FAIL


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a recipe file into a flat dict, with errors that name the file."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"Recipe file '{path}' does not exist.")
    try:
        content = _load_yaml_text(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML ({err}).") from err
    if not isinstance(content, dict):
        raise RecipeError(f"{path}: a recipe is a flat mapping of key: value, got {type(content).__name__}.")
    nested = [k for k, v in content.items() if isinstance(v, dict) and k not in ("peft",)]
    if nested:
        raise RecipeError(f"{path}: recipes are flat; key '{nested[0]}' holds a mapping. Write its keys at top level.")
    return content


def parse_cli_overrides(argv: Sequence[str]) -> dict[str, Any]:
    """Turn `--key value`, `--key=value` and bare `--flag` into a dict of YAML-typed scalars."""
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise RecipeError(f"command line: expected --key value, got '{arg}'.")
        key, eq, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        if not eq:
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
                i += 1
            else:
                value = "true"
        overrides[key] = _load_yaml_text(value) if value != "" else None
        i += 1
    return overrides


def parse_recipe(recipe_path: str | os.PathLike | None, argv: Sequence[str] = (), **extra: Any) -> Recipe:
    """Parse a recipe file plus command-line overrides (plus keyword overrides from Python) into a `Recipe`."""
    values: dict[str, Any] = dict(load_yaml(recipe_path)) if recipe_path is not None else {}
    where = str(recipe_path) if recipe_path is not None else "recipe"
    cli = parse_cli_overrides(list(argv))
    for layer in (cli, extra):
        for key, other in (BATCH_SIZE_KEYS, BATCH_SIZE_KEYS[::-1]):
            if key in layer and other not in layer:  # a later layer's batch size replaces the other kind's
                values.pop(other, None)
        values.update(layer)

    method = values.pop("method", None)
    if method is None:
        raise RecipeError(f"{where}: key 'method' is missing. Choose one of: {', '.join(sorted(METHODS))}.")
    try:
        spec = get_method(str(method))
    except KeyError as err:
        raise RecipeError(f"{where}: {err.args[0]}") from err

    groups = {"model": ModelArguments, "data": DataArguments, "training": spec.config_class}
    known = {name: (group, hint) for group, cls in groups.items() for name, hint in _fields(cls).items()}
    unknown = [k for k in values if k not in known]
    if unknown:
        import difflib

        hints = [difflib.get_close_matches(k, known, n=1) for k in unknown]
        detail = "; ".join(f"'{k}'" + (f" (did you mean '{h[0]}'?)" if h else "") for k, h in zip(unknown, hints))
        raise RecipeError(f"{where}: unknown key(s) {detail} for method '{method}'.")

    kwargs: dict[str, dict[str, Any]] = {group: {} for group in groups}
    for key, value in values.items():
        group, hint = known[key]
        source = "command line" if key in cli else where
        if isinstance(value, str):
            value = os.path.expandvars(value)
        kwargs[group][key] = coerce(value, hint, key, source)

    built = {}
    for group, cls in groups.items():
        try:
            built[group] = cls(**kwargs[group])
        except (ValueError, TypeError) as err:
            raise RecipeError(f"{where}: {err}") from err
    return Recipe(method=str(method), model=built["model"], data=built["data"], training=built["training"],
                  source=where, explicit_keys=frozenset(values))
