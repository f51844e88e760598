"""Recipe parsing: one flat YAML file, then `--key value` overrides, mapped onto dataclasses.

`transformers.HfArgumentParser` turns the dataclasses into options (type, `Literal` choices, default, help) and
converts the values; this module adds what it lacks: the YAML recipe, "did you mean" for unknown keys, the
batch-size precedence between the file and the command line, `${VAR}` expansion, and errors that name the key and
where it came from. All of this happens before any model or data is loaded.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import math
import os
import re
import types
import typing
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from transformers import HfArgumentParser

from hf_sentcl.registry import METHODS, get_method

if TYPE_CHECKING:
    from hf_sentcl.configs import DataArguments, ModelArguments

#: the program name of `python -m hf_sentcl.run`; `hf-sentcl train` passes its own (`recipe_usage`)
RUN_PROG = "python -m hf_sentcl.run"


def recipe_usage(prog: str = RUN_PROG) -> str:
    """The usage line of the command `prog` that trains a recipe, as the user called it (`hf-sentcl train`,
    `python -m hf_sentcl.run`)."""
    return f"{prog} RECIPE.yaml [--key value ...] [--help]"


USAGE = recipe_usage()


RECIPE_ONLY_KEYS = ("method",)


#: two ways of saying how large the batch is; set on the command line, either replaces the other from the file
BATCH_SIZE_KEYS = ("global_train_batch_size", "per_device_train_batch_size")


class RecipeError(ValueError):
    """A recipe or command-line override that cannot be used; the message names the key at fault."""


class _RecipeLoader(yaml.SafeLoader):
    """YAML with 1.2 booleans: only true/false are booleans, so `eval_strategy: no` stays the string 'no'.

    Boolean fields still accept yes/no (and y/n, t/f, 1/0): HfArgumentParser's `string_to_bool` converts them.
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


class RecipeArgumentParser(HfArgumentParser):
    """`HfArgumentParser` over one method's dataclasses: it turns every field into an option with the field's type,
    `Literal`/enum choices, default and help, converts values and refuses bad ones, and prints `--help`.

    Options are grouped by the dataclass that declares them (model, data, then the method's config and the classes
    it inherits from, `transformers.TrainingArguments` last). Errors raise `RecipeError` instead of exiting.
    """

    def __init__(self, method: str, prog: str = RUN_PROG):
        from hf_sentcl.configs import DataArguments, ModelArguments  # imported here: they load torch

        spec = get_method(method)
        super().__init__(
            prog=prog,
            usage=recipe_usage(prog),
            description=f"Method '{method}' ({spec.config_class.__name__}): {spec.summary} Every key below goes in the "
            "recipe (key: value) or on the command line (--key value, which wins over the recipe).",
            formatter_class=_HelpFormatter,
            add_help=False,
            allow_abbrev=False,
            exit_on_error=False,
        )
        self.dataclass_types = [ModelArguments, DataArguments, spec.config_class]
        self.hints: dict[str, Any] = {}  # key -> type hint
        self.groups: dict[str, str] = {}  # key -> "model" / "data" / "training"
        self.actions: dict[str, argparse.Action] = {}  # key -> its option
        owners = [ModelArguments, DataArguments] + [c for c in spec.config_class.__mro__ if dataclasses.is_dataclass(c)]
        for owner in owners:
            root = owner if owner in (ModelArguments, DataArguments) else spec.config_class
            hints = typing.get_type_hints(root)
            own = [f for f in dataclasses.fields(root) if f.init and f.name not in self.hints
                   and f.name in vars(owner).get("__annotations__", {})]
            if not own:
                continue
            group = self.add_argument_group(owner.__name__, _first_line(owner.__doc__))
            for f in own:
                self._add_field(group, f, hints[f.name])
                self.groups[f.name] = {ModelArguments: "model", DataArguments: "data"}.get(root, "training")

    def _add_field(self, group: argparse._ArgumentGroup, f: dataclasses.Field, hint: Any) -> None:
        help_text = f.metadata.get("help", "")
        if "%(" not in help_text:  # argparse formats help with %
            help_text = help_text.replace("%", "%%")
        # a copy: HfArgumentParser narrows field.type (Optional[X] -> X) in place
        f = copy.copy(f)
        f.metadata = types.MappingProxyType({**f.metadata, "help": help_text})
        f.type = hint
        self._parse_dataclass_field(group, f)
        action = self._option_string_actions[f"--{f.name}"]
        action.metavar = _type_name(hint, action.choices)
        self.hints[f.name] = hint
        self.actions[f.name] = action
        negation = self._option_string_actions.get(f"--no_{f.name}")
        if negation is not None:  # recipes say `key: false`; the --no_key twins only clutter the help
            negation.help = argparse.SUPPRESS

    def error(self, message: str):
        raise RecipeError(message)

    def convert(self, values: dict[str, Any], source_of: Callable[[str], str]) -> dict[str, dict[str, Any]]:
        """Convert recipe values (YAML scalars, lists, mappings) to the fields' types: {group: {key: value}}."""
        argv: list[str] = []
        converted: dict[str, dict[str, Any]] = {group: {} for group in ("model", "data", "training")}
        for key, value in values.items():
            hint, action, group = self.hints[key], self.actions[key], self.groups[key]
            if value is None or _passes_through(value, hint, action):
                if value is None and not _accepts(hint, type(None)):
                    raise RecipeError(f"{source_of(key)}: key '{key}' must not be empty (expected {action.metavar}).")
                converted[group][key] = value
            elif isinstance(value, dict) or (isinstance(value, list) and action.nargs != "+"):
                raise RecipeError(
                    f"{source_of(key)}: key '{key}' expects {action.metavar}, got {value!r} ({type(value).__name__})."
                )
            elif action.nargs == "+":  # a list, 'a,b', or one scalar (a one-element list)
                items = value if isinstance(value, list) else value.split(",") if isinstance(value, str) else [value]
                argv += [f"--{key}", *map(_argv_text, items)]
            else:
                argv.append(f"--{key}={_argv_text(value)}")
        try:
            namespace, rest = self.parse_known_args(argv)
        except argparse.ArgumentError as err:
            key = err.argument_name.split("/")[0].removeprefix("--")
            raise RecipeError(f"{source_of(key)}: {_conversion_message(key, self.actions[key], values[key])}") from None
        if rest:  # e.g. a list item for a key that takes one value
            raise RecipeError(f"recipe: cannot read {rest}; write lists as [a, b] or a,b.")
        for key in values:
            if key not in converted[self.groups[key]]:
                converted[self.groups[key]][key] = getattr(namespace, key)
        return converted


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--key TYPE` (one spelling: the hyphenated aliases work but are not listed), help, then the default."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        return f"{action.option_strings[0]} {action.metavar}"


def _first_line(doc: str | None) -> str | None:
    return doc.strip().split("\n\n")[0].replace("\n", " ") if doc else None


def _options(hint: Any) -> tuple[Any, ...]:
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _accepts(hint: Any, kind: type) -> bool:
    """Whether `hint` (or one member of a union) is `kind` or a generic of it (list[int] for list)."""
    return any(option is Any or (typing.get_origin(option) or option) is kind for option in _options(hint))


def _passes_through(value: Any, hint: Any, action: argparse.Action) -> bool:
    """Mappings, empty lists, and lists for a key that takes one option value cannot travel as command-line text: a
    key whose type accepts them (e.g. `peft`, `eval_tasks: []`, `report_to: [a, b]`) takes them as they are."""
    if isinstance(value, dict):
        return _accepts(hint, dict)
    return isinstance(value, list) and (not value or action.nargs != "+") and _accepts(hint, list)


def _type_name(hint: Any, choices: Sequence[Any] | None = None) -> str:
    """How `--help` writes a key's type: float, int | None, list[str], {cls,mean,...}."""
    names = []
    for option in _options(hint):
        origin = typing.get_origin(option)
        if option is type(None):
            names.append("None")
        elif choices is not None and (origin is Literal or isinstance(option, type) and issubclass(option, enum.Enum)):
            names.append("{" + ",".join(map(str, choices)) + "}")
        elif origin is not None:
            names.append(str(option).replace("typing.", ""))
        else:
            names.append(getattr(option, "__name__", str(option)))
    if choices is not None and names.count("str") and any(n.startswith("{") for n in names):
        names.remove("str")  # `IntervalStrategy | str`: the parser takes the strategy's names only
    return " | ".join(dict.fromkeys(names))


def _argv_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def _conversion_message(key: str, action: argparse.Action, value: Any) -> str:
    if action.choices is not None:
        import difflib

        close = difflib.get_close_matches(str(value), [str(c) for c in action.choices], n=1)
        return (
            f"key '{key}' must be one of {', '.join(map(str, action.choices))}; got {value!r}"
            + (f" (did you mean '{close[0]}'?)." if close else ".")
        )
    return f"key '{key}' expects {action.metavar}, got {value!r} ({type(value).__name__})."


def method_help(method: str, recipe_values: dict[str, Any] | None = None, prog: str = RUN_PROG) -> str:
    """The `--help` text of `method`: every key with its type, default and help; keys the recipe sets show the
    recipe's value too. `prog`: the command as the user called it, for the usage line."""
    parser = RecipeArgumentParser(method, prog)
    for key, value in (recipe_values or {}).items():
        action = parser.actions.get(key)
        if action is not None:
            action.help = f"{action.help} (default: %(default)s) [recipe: {str(value).replace('%', '%%')}]"
    return parser.format_help()


def method_list() -> str:
    """The registered methods, one line each: what `--help` shows before a method is chosen."""
    return "Methods (key 'method'; `--method NAME --help` lists its keys):\n" + "\n".join(
        f"  {name:12} {spec.summary}" for name, spec in METHODS.items()
    )


def recipe_help(argv: Sequence[str], prog: str = RUN_PROG) -> str:
    """The text of `[RECIPE] [--key value ...] --help` (help flags already removed from `argv`): the method's keys
    with their types, defaults and the recipe's values (`method_help`) when the recipe or `--method` names a method;
    else the usage and the methods, which need no config class (so no torch). RecipeError for an unreadable recipe,
    KeyError for an unknown method."""
    recipe = argv[0] if argv and not argv[0].startswith("--") else None
    values, _, _ = merged_values(recipe, argv[1:] if recipe else argv)
    if "method" not in values:
        return f"usage: {recipe_usage(prog)}\n\n{method_list()}"
    method = str(values.pop("method"))
    return method_help(method, values, prog)


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
    values, cli, where = merged_values(recipe_path, argv, extra)
    method = values.pop("method", None)
    if method is None:
        raise RecipeError(f"{where}: key 'method' is missing. Choose one of: {', '.join(sorted(METHODS))}.")
    try:
        parser = RecipeArgumentParser(str(method))
    except KeyError as err:
        raise RecipeError(f"{where}: {err.args[0]}") from err

    def source_of(key: str) -> str:
        return "command line" if key in cli else where

    unknown = [k for k in values if k not in parser.hints]
    # a mapping is a value only for a key whose type takes one (peft, accelerator_config, lr_scheduler_kwargs, ...)
    if nested := [k for k in unknown if isinstance(values[k], dict)]:
        raise RecipeError(
            f"{source_of(nested[0])}: recipes are flat; key '{nested[0]}' holds a mapping but is not a key. Write its "
            "keys at top level."
        )
    if unknown:
        raise RecipeError(unknown_keys_message(unknown, str(method), parser.hints, cli, where))

    for key, value in values.items():
        if isinstance(value, str):
            values[key] = os.path.expandvars(value)
    kwargs = parser.convert(values, source_of)
    for group in kwargs.values():
        for key, value in group.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise RecipeError(f"{source_of(key)}: key '{key}' is {value}; give a finite number.")
    if "output_dir" in values and not values["output_dir"]:  # TrainingArguments would use ./trainer_output
        raise RecipeError(
            f"{source_of('output_dir')}: key 'output_dir' is empty; give the folder for checkpoints, results and the "
            "encoder."
        )

    built = {}
    for group, cls in zip(kwargs, parser.dataclass_types):
        try:
            built[group] = cls(**kwargs[group])
        except (ValueError, TypeError) as err:  # the configs' own checks start with the key they refuse
            key = next((k for k in values if str(err).startswith((f"{k} ", f"key '{k}'"))), None)
            raise RecipeError(f"{source_of(key) if key else where}: {err}") from err
    return Recipe(method=str(method), model=built["model"], data=built["data"], training=built["training"],
                  source=where, explicit_keys=frozenset(values))


def unknown_keys_message(
    unknown: Sequence[str], method: str, known: Collection[str], cli: Collection[str], where: str
) -> str:
    """The error for keys that `method` does not have, one sentence per place they were written: the recipe file
    (`where`: 'unknown key ...') and the command line (`cli`'s keys: 'unknown option --...'), so that a typo in an
    override is not blamed on the file. Each key gets a "did you mean" among `known`, or, when it is a key of other
    methods (`objective` on a SimCSE recipe), their names, and the message ends with how to choose that method."""
    sentences, owners = [], []
    for source, keys, option in ((where, [k for k in unknown if k not in cli], False),
                                 ("command line", [k for k in unknown if k in cli], True)):
        if keys:
            details = [_unknown_key_detail(key, method, known, "--" if option else "", owners) for key in keys]
            noun = ("option" if option else "key") + ("s" if len(keys) > 1 else "")
            sentences.append(f"{source}: unknown {noun} {', '.join(details)} for method '{method}'.")
    if owners:
        which = "that method:" if len(owners) == 1 else "one of those methods, e.g."
        sentences.append(f"To use a key of another method, choose {which} `method: {owners[0]}` in the recipe, or "
                         f"`--method {owners[0]}` on the command line.")
    return " ".join(sentences)


def _unknown_key_detail(key: str, method: str, known: Collection[str], prefix: str, owners: list[str]) -> str:
    """`'KEY' (a key of method 'M')` when other methods have it (added to `owners`), else `'KEY' (did you mean
    'K'?)` with the closest of `known`, or `'KEY'` alone. `prefix`: '--' for a command-line option."""
    import difflib

    if others := [name for name in methods_with_key(key) if name != method]:
        owners += [name for name in others if name not in owners]
        return f"'{prefix}{key}' (a key of method{'s' if len(others) > 1 else ''} {', '.join(map(repr, others))})"
    close = difflib.get_close_matches(key, known, n=1)
    return f"'{prefix}{key}'" + (f" (did you mean '{prefix}{close[0]}'?)" if close else "")


def methods_with_key(key: str) -> list[str]:
    """The registered methods whose config class has the key `key` (the model and data keys are every method's)."""
    return [name for name, spec in METHODS.items()
            if key in {f.name for f in dataclasses.fields(spec.config_class) if f.init}]


def merged_values(
    recipe_path: str | os.PathLike | None, argv: Sequence[str] = (), extra: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The recipe file's values with the command line's and `extra`'s on top (a batch size set by a later layer
    replaces the other kind of batch size); returns (values, command-line values, where the recipe came from)."""
    values: dict[str, Any] = dict(load_yaml(recipe_path)) if recipe_path is not None else {}
    where = str(recipe_path) if recipe_path is not None else "recipe"
    cli = parse_cli_overrides(list(argv))
    for layer in (cli, extra or {}):
        for key, other in (BATCH_SIZE_KEYS, BATCH_SIZE_KEYS[::-1]):
            if key in layer and other not in layer:  # a later layer's batch size replaces the other kind's
                values.pop(other, None)
        values.update(layer)
    return values, cli, where
