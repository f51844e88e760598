"""The method registry: recipe `method:` name -> config dataclass, trainer class, data layout, paper and stages.

Methods come from two places, found the first time the registry is read, and from `register_method` calls at run
time:
- `hf_sentcl.methods`: a built-in method is one subpackage there (config, trainer, data hook, loss and this
  registration together), whose `__init__` defines `METHOD`, a `MethodSpec` (or `METHODS`, a tuple of them, when
  one folder holds several recipe names: SimCSE's `simcse` and `simcse_sup`);
- the `hf_sentcl.methods` entry-point group: another installed package adds a method without editing hf_sentcl,
  with `[project.entry-points."hf_sentcl.methods"] my_method = "my_package.my_method:METHOD"`.

Nothing here imports a config or trainer until it is asked for, so every layer may read the registry; a method's
`__init__` must stay as light (its `MethodSpec` names its classes by import path)."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType

#: where built-in methods live, one subpackage each, and the entry-point group of other packages' methods
METHOD_PACKAGE = ENTRY_POINT_GROUP = "hf_sentcl.methods"


@dataclass(frozen=True)
class MethodSpec:
    """How to build one method: its config class, its trainer (imported lazily) and its text columns."""

    name: str
    config_path: str
    trainer_path: str
    text_columns: tuple[str, ...]
    summary: str
    optional_text_columns: tuple[str, ...] = ()
    #: a numeric column every training row has (e.g. a gold similarity score), read as float and handed to the
    #: trainer as `labels`; None when the examples are text only
    score_column: str | None = None
    #: "module.function": recipe -> list of recipes trained one after another, each stage starting from the
    #: previous stage's exported encoder (default: the recipe alone)
    stages_path: str | None = None
    #: "module.function": recipe -> an object with `check()` (raises before any model loads) and
    #: `build(tokenizer) -> (dataset, num_views, collator)`, for examples that are more than text views (labels);
    #: or None, for the plain-text loader
    train_data_path: str | None = None
    #: the paper that defines the method (cited by the model card and the docs)
    paper: Paper | None = None
    #: the method's page under docs/methods/ (without `.md`); default: its name
    docs_page: str | None = None
    #: the folder, inside output_dir, of a chained method's first stage (a run folder of its own)
    stage_dirname: str | None = None
    #: why the method cannot train with sharded weights (FSDP, ZeRO-3): the weights it uses outside the encoder's
    #: forward, where those configs leave them sharded; None when it can
    sharded_weights_problem: str | None = None

    @staticmethod
    def _load(path: str):
        module, _, attr = path.rpartition(".")
        return getattr(importlib.import_module(module), attr)

    def stages(self, recipe) -> list:
        """The recipe's training stages (one, unless the method chains several)."""
        return self._load(self.stages_path)(recipe) if self.stages_path else [recipe]

    def train_data(self, recipe):
        """The method's own training data for `recipe`, or None for the plain-text views."""
        return self._load(self.train_data_path)(recipe) if self.train_data_path else None

    @property
    def required_columns(self) -> tuple[str, ...]:
        """The columns every training row must have: the text views and the score column, if any."""
        return self.text_columns + ((self.score_column,) if self.score_column else ())

    @property
    def page(self) -> str:
        return self.docs_page or self.name

    @property
    def config_class(self) -> type:
        return self._load(self.config_path)

    @property
    def trainer_class(self) -> type:
        return self._load(self.trainer_path)


@dataclass(frozen=True)
class ReportedSTS:
    """A 7-STS result a paper (or its authors' code) reports: Spearman x 100, STS12-16, STS-B and SICK-R averaged."""

    setting: str  #: the model and variant as the source names it, e.g. "unsup-SimCSE-BERT-base"
    avg: float
    source: str  #: where the figure is printed, e.g. "SimCSE Table 5"
    #: the seven task figures in that order (STS12, STS13, STS14, STS15, STS16, STS-B, SICK-R), where copied
    tasks: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Paper:
    """A source paper: cited by authors, title, venue and arXiv id in the docs, by BibTeX in model cards, with the STS
    figures it reports (the benchmark table prints them beside ours)."""

    authors: str
    title: str
    venue: str
    arxiv: str | None
    bibtex: str
    #: the authors' public code of the method (the reference implementation), where they released one
    code: str | None = None
    reported: tuple[ReportedSTS, ...] = ()

    def figure(self, setting: str) -> ReportedSTS:
        """The reported result of `setting`; KeyError naming the settings the paper has."""
        for result in self.reported:
            if result.setting == setting:
                return result
        raise KeyError(f"{self.title}: no reported setting '{setting}'; it has {[r.setting for r in self.reported]}")

    def reference(self) -> str:
        arxiv = f", arXiv:{self.arxiv}" if self.arxiv else ""
        return f"{self.authors}. {self.title}. {self.venue}{arxiv}."


#: the papers of the plug-ins that are not methods, cited by the model card of a run that uses them; a method's paper
#: is its `MethodSpec.paper`, declared in its folder
PAPERS: dict[str, Paper] = {
    # the margin plug-in (`perturbation:`): IFM against the gradient, BYOP with it
    "ifm": Paper(
        "Joshua Robinson, Li Sun, Ke Yu, Kayhan Batmanghelich, Stefanie Jegelka, Suvrit Sra",
        "Can contrastive learning avoid shortcut solutions?", "NeurIPS 2021", "2106.11230",
        """@inproceedings{robinson2021shortcuts,
  title = {Can contrastive learning avoid shortcut solutions?},
  author = {Robinson, Joshua and Sun, Li and Yu, Ke and Batmanghelich, Kayhan and Jegelka, Stefanie and Sra, Suvrit},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year = {2021}
}""",
        code="https://github.com/joshr17/IFM",
    ),
    "byop": Paper(
        "Anonymous",
        "Bootstrap Your Own PLM: Boosting Semantic Features of PLMs for Unsupervised Contrastive Learning",
        "ACL submission (anonymous)", None,
        """@misc{byop,
  title = {Bootstrap Your Own {PLM}: Boosting Semantic Features of {PLMs} for Unsupervised Contrastive Learning},
  note = {Anonymous ACL submission}
}""",
        reported=(ReportedSTS("BERT-base +BYOPC", 77.32, "papers/byop.txt Table 1",
                              (71.84, 82.86, 76.16, 82.61, 79.07, 79.11, 69.61)),),
    ),
}


def folder_methods(module: ModuleType) -> tuple[MethodSpec, ...]:
    """The methods a method folder's `__init__` declares: its `METHOD`, or its `METHODS` tuple when one folder holds
    several recipe `method:` names that share their config, trainer module and paper (SimCSE's `simcse` and
    `simcse_sup`)."""
    specs = getattr(module, "METHODS", None)
    return tuple(specs) if specs is not None else (module.METHOD,)


class MethodRegistry(Mapping[str, MethodSpec]):
    """The methods by name; the built-in method folders and the entry points are read on first use (module
    docstring), so that importing the registry stays cheap."""

    def __init__(self) -> None:
        self._methods: dict[str, MethodSpec] = {}
        self._discovered = False

    def register(self, spec: MethodSpec, origin: str = "hf_sentcl") -> None:
        known = self._methods.get(spec.name)
        if known is not None and known is not spec:
            raise ValueError(f"{origin}: method '{spec.name}' is already registered ({known.summary!r}); choose "
                             "another name.")
        self._methods[spec.name] = spec

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(METHOD_PACKAGE)
        for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
            origin = f"{METHOD_PACKAGE}.{module}"
            for spec in folder_methods(importlib.import_module(origin)):
                self.register(spec, origin)
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            self._register_entry_point(entry)

    def _register_entry_point(self, entry: importlib.metadata.EntryPoint) -> None:
        """Another package's method; one that fails to load or to register is skipped with a warning that names
        it, so that a broken plug-in does not stop runs of other methods."""
        origin = f"entry point '{entry.name} = {entry.value}' of {getattr(entry.dist, 'name', 'an installed package')}"
        try:
            spec = entry.load()
            if not isinstance(spec, MethodSpec):
                raise TypeError(f"it names a {type(spec).__name__}, not a hf_sentcl.registry.MethodSpec")
            if spec.name != entry.name:
                raise ValueError(f"its MethodSpec is named '{spec.name}'; name the entry point the same")
            self.register(spec, origin)
        except Exception as err:  # noqa: BLE001 - any failure of a third-party import
            warnings.warn(f"hf_sentcl method {origin} is skipped: {err}", stacklevel=3)

    def __getitem__(self, name: str) -> MethodSpec:
        self._discover()
        return self._methods[name]

    def __iter__(self) -> Iterator[str]:
        self._discover()
        return iter(self._methods)

    def __len__(self) -> int:
        self._discover()
        return len(self._methods)


METHODS = MethodRegistry()


def register_method(spec: MethodSpec) -> None:
    """Add a method so that recipes can name it."""
    METHODS.register(spec)


def get_method(name: str) -> MethodSpec:
    """The method a recipe names; KeyError listing the registered methods when there is none of that name."""
    if name not in METHODS:
        raise KeyError(f"unknown method '{name}'. Choose one of: {', '.join(sorted(METHODS))}.")
    return METHODS[name]
