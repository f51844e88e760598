"""PromptBERT's recipe keys (Jiang et al. 2022): the template the encoder embeds with, the second template of the
positive view, and template denoising. `temperature` comes from `ContrastiveArguments` (0.05, the authors' `--temp`),
the IFM/BYOP margin keys from `PerturbationArguments` (the loss is SimCSE's in-batch InfoNCE)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.contrastive import ContrastiveArguments
from hf_sentcl.configs.perturbation import PerturbationArguments
from hf_sentcl.modeling.prompt import check_template

#: the authors' unsupervised BERT templates (run.sh, `unsup-bert`): the first is also the one evaluation embeds with
#: (their `--mask_embedding_sentence_template`), the second gives the other view (`..._different_template`)
BERT_TEMPLATE = 'This sentence of "[X]" means [MASK] .'
BERT_SECOND_TEMPLATE = 'This sentence : "[X]" means [MASK] .'


@dataclass
class PromptBERTConfig(PerturbationArguments, ContrastiveArguments, SentCLTrainingArguments):
    """Unsupervised PromptBERT: the sentence in `template` and in `second_template` (dropout on both) are a positive
    pair, the batch's other sentences the negatives; the vector is the [MASK] state (minus the template's own with
    `template_denoising`)."""

    template: str = field(default=BERT_TEMPLATE, metadata={
        "help": "The prompt template: one [X] (the sentence) and one [MASK] (whose last-layer state is the sentence "
        "vector). The trained encoder keeps it and embeds with it everywhere (evaluation, encode, export). "
        f"Default: the authors' BERT template {BERT_TEMPLATE!r}."})
    second_template: str = field(default=BERT_SECOND_TEMPLATE, metadata={
        "help": "The template of the positive view (a different template of the same sentence); same form as "
        f"'template'. Default: the authors' {BERT_SECOND_TEMPLATE!r}."})
    template_denoising: bool = field(default=True, metadata={
        "help": "In training, subtract from each view's [MASK] state the [MASK] state of its template with the "
        "sentence left out, run at the position ids the template has around that sentence (the paper's template "
        "denoising). Evaluation and the saved encoder use the plain [MASK] state, as the authors' evaluation does."})

    def __post_init__(self):
        super().__post_init__()
        check_template(self.template, "template")
        check_template(self.second_template, "second_template")
