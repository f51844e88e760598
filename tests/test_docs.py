"""The user documentation stays true to the code: every relative link of README.md and docs/ leads to a file, every
registered method has a row in the README's table, and every recipe key of a method's config is in its docs page."""

import dataclasses
import re
from pathlib import Path

import pytest

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.perturbation import PerturbationArguments
from hf_sentcl.registry import METHODS

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    missing = []
    for target in relative_links(page):
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"


def test_every_method_has_a_readme_row_and_a_page():
    readme = (REPO / "README.md").read_text()
    for name, spec in METHODS.items():
        assert f"`method: {name}`" in readme, f"README's method table has no row for '{name}'"
        assert f"(docs/methods/{spec.page}.md)" in readme, f"README's method table links no page of '{name}'"


def own_keys(config: type, *shared: type) -> set[str]:
    """The recipe keys `config` adds to the shared dataclasses (the fields of those have their own pages)."""
    common = {f.name for cls in shared for f in dataclasses.fields(cls)}
    return {f.name for f in dataclasses.fields(config)} - common


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_page_lists_every_key(name):
    page = (REPO / "docs" / "methods" / f"{METHODS[name].page}.md").read_text()
    keys = own_keys(METHODS[name].config_class, SentCLTrainingArguments, PerturbationArguments)
    assert keys, f"{name}: no method keys found"
    assert not [k for k in sorted(keys) if f"`{k}`" not in page], f"docs/methods/{METHODS[name].page}.md"
    if issubclass(METHODS[name].config_class, PerturbationArguments):
        assert "(margin.md)" in page, f"{name} takes the margin keys: link docs/methods/margin.md"


def test_margin_page_lists_every_key():
    page = (REPO / "docs" / "methods" / "margin.md").read_text()
    keys = {f.name for f in dataclasses.fields(PerturbationArguments)}
    assert not [k for k in sorted(keys) if f"`{k}`" not in page]
    takers = [n for n, spec in METHODS.items() if issubclass(spec.config_class, PerturbationArguments)]
    assert takers
    for name in takers:
        assert "(margin.md)" in (REPO / "docs" / "methods" / f"{METHODS[name].page}.md").read_text(), name
