"""IFM/BYOP margin knobs as a dataclass mixin, for any method whose loss is an in-batch InfoNCE, and the grammar of
their `perturbation` spec (`parse_perturbation`, read by `hf_sentcl.losses.margin` too).

A method's config inherits it before `SentCLTrainingArguments` (`class XConfig(PerturbationArguments,
SentCLTrainingArguments)`), and its trainer passes `args.margin_loss_kwargs()` to `margin_info_nce` (or to
`margin_cross_entropy` for a loss written as a similarity matrix).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from hf_sentcl.configs.validation import check_choices, check_range

_TERM = re.compile(r"([pn])([+-])")


@dataclass(frozen=True)
class Perturbation:
    """A parsed perturbation spec: the sign (+1, -1 or 0) of the margin added to the positive / the negatives."""

    positive: int
    negative: int

    @property
    def spec(self) -> str:
        """The canonical spec string ('p' term first), e.g. 'p+n-'."""
        sign = {1: "+", -1: "-"}
        return "".join(f"{k}{sign[s]}" for k, s in (("p", self.positive), ("n", self.negative)) if s)

    @property
    def is_identity(self) -> bool:
        """True when every logit of a row moves by the same amount (p-n-, p+n+): the loss equals plain InfoNCE."""
        return self.positive == self.negative


def parse_perturbation(spec: str) -> Perturbation:
    """Parse a spec made of the terms p+, p-, n+, n- (each target at most once), e.g. 'p+n-', 'n-', 'p-n+'.

    Raises ValueError with the accepted grammar for anything else ('p*', 'x+', '', 'p+p-').
    """
    if isinstance(spec, Perturbation):
        return spec
    text = str(spec).strip().replace(" ", "")
    terms = _TERM.findall(text)
    if not text or "".join(a + b for a, b in terms) != text:
        raise ValueError(
            f"invalid perturbation {spec!r}: write one or two of the terms p+, p-, n+, n- "
            "('p' = the positive logit, 'n' = every negative logit, '+' adds the margin, '-' subtracts it), "
            "e.g. 'p+n-' (BYOP) or 'p-n+' (IFM)."
        )
    signs: dict[str, int] = {}
    for target, sign in terms:
        if target in signs:
            raise ValueError(f"invalid perturbation {spec!r}: '{target}' is perturbed twice; use each of p, n once.")
        signs[target] = 1 if sign == "+" else -1
    return Perturbation(positive=signs.get("p", 0), negative=signs.get("n", 0))




def warn_if_identity(perturbation: str | Perturbation) -> None:
    """Warn that p-n- / p+n+ leave InfoNCE unchanged (softmax shift invariance), although the paper lists them."""
    spec = parse_perturbation(perturbation)
    if spec.is_identity:
        warnings.warn(
            f"perturbation '{spec.spec}' shifts every logit of a row by the same margin, so the loss equals plain "
            "InfoNCE (a softmax is shift-invariant); BYOP's Table 6 lists it, but under Eq. 3 it changes nothing.",
            stacklevel=3,
        )


MARGIN_TYPES = ("constant", "dynamic")
#: cosine similarities lie in [-1, 1]: a margin of 1 already shifts a logit by half that range
MAX_MARGIN = 1.0


@dataclass
class PerturbationArguments:
    """Margin perturbation of the InfoNCE logits (BYOP Eq. 3; IFM = 'p-n+')."""

    perturbation: str | None = field(
        default=None,
        metadata={
            "help": "Margin perturbation of the logits: terms p+, p-, n+, n- ('p' positive, 'n' every negative; "
            "'+' adds the margin to the cosine similarity before /temperature, '-' subtracts it), e.g. 'p+n-' "
            "(BYOP) or 'p-n+' (IFM). Unset = plain InfoNCE."
        },
    )
    margin: float = field(
        default=0.0,
        metadata={"help": f"Constant margin m in cosine units, in [0, {MAX_MARGIN:g}] (BYOP's grid: 0.01-0.1)."},
    )
    margin_type: Literal[MARGIN_TYPES] = field(
        default="constant",
        metadata={"help": "'constant' (BYOP-C, IFM) or 'dynamic': m_i = sim(z_i, z'_i) / (N - 1) (BYOP-D)."},
    )
    detach_margin: bool = field(
        default=True,
        metadata={"help": "Dynamic margin only: no gradient through m_i, so it acts as a per-row constant shift."},
    )
    multi_task: bool = field(
        default=False, metadata={"help": "Loss 0.5 * (plain + perturbed): IFM's Eq. 3 and BYOP's '-M' variants."}
    )

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        self.validate_perturbation()

    def validate_perturbation(self) -> None:
        """Check the knobs together; errors name the key at fault."""
        check_choices(self)
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0 (the sign comes from 'perturbation'), got {self.margin}.")
        check_range("margin", self.margin, 0, MAX_MARGIN)
        if self.perturbation is None:
            if self.margin or self.margin_type == "dynamic" or self.multi_task:
                raise ValueError(
                    "margin / margin_type: dynamic / multi_task have no effect without 'perturbation'; "
                    "set perturbation (e.g. 'p+n-') or drop them."
                )
            return
        try:
            spec = parse_perturbation(self.perturbation)
        except ValueError as err:
            raise ValueError(f"key 'perturbation': {err}") from None
        self.perturbation = spec.spec
        if self.margin_type == "dynamic" and self.margin:
            raise ValueError(
                f"margin={self.margin} is unused with margin_type: dynamic (m_i comes from the positive "
                "similarity); remove 'margin' or use margin_type: constant."
            )
        if self.margin_type == "constant" and not self.margin:
            raise ValueError(
                f"perturbation '{spec.spec}' with margin 0 is plain InfoNCE; set 'margin' (e.g. 0.01-0.1) "
                "or margin_type: dynamic."
            )
        warn_if_identity(spec)

    def margin_loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `margin_info_nce` / `margin_cross_entropy` (perturbation None = plain InfoNCE)."""
        return {
            "perturbation": self.perturbation,
            "margin": self.margin,
            "dynamic": self.margin_type == "dynamic",
            "multi_task": self.multi_task,
            "detach_margin": self.detach_margin,
        }
