"""The method registry: recipe `method:` name -> config dataclass, trainer class, data layout, paper and stages.

Nothing here imports a config or trainer until it is asked for, so every layer may read the registry."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSpec:
    """How to build one method: its config class, its trainer (imported lazily) and its text columns."""

    name: str
    config_path: str
    trainer_path: str
    text_columns: tuple[str, ...]
    summary: str
    optional_text_columns: tuple[str, ...] = ()
    #: "module.function": recipe -> list of recipes trained one after another, each stage starting from the
    #: previous stage's exported encoder (default: the recipe alone)
    stages_path: str | None = None
    #: "module.function": recipe -> an object with `check()` (raises before any model loads) and
    #: `build(tokenizer) -> (dataset, num_views, collator)`, for examples that are more than text views (labels);
    #: or None, for the plain-text loader
    train_data_path: str | None = None
    #: the key in `PAPERS` of the paper that defines the method (cited by the model card and the docs)
    paper: str | None = None
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
    def config_class(self) -> type:
        return self._load(self.config_path)

    @property
    def trainer_class(self) -> type:
        return self._load(self.trainer_path)


@dataclass(frozen=True)
class Paper:
    """A source paper: cited by authors, title, venue and arXiv id in the docs, by BibTeX in model cards."""

    authors: str
    title: str
    venue: str
    arxiv: str | None
    bibtex: str
    #: the authors' public code of the method (the reference implementation), where they released one
    code: str | None = None

    def reference(self) -> str:
        arxiv = f", arXiv:{self.arxiv}" if self.arxiv else ""
        return f"{self.authors}. {self.title}. {self.venue}{arxiv}."


PAPERS: dict[str, Paper] = {
    "simcse": Paper(
        "Tianyu Gao, Xingcheng Yao, Danqi Chen",
        "SimCSE: Simple Contrastive Learning of Sentence Embeddings", "EMNLP 2021", "2104.08821",
        """@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  year = {2021}
}""",
        code="https://github.com/princeton-nlp/SimCSE",
    ),
    "self_guided": Paper(
        "Taeuk Kim, Kang Min Yoo, Sang-goo Lee",
        "Self-Guided Contrastive Learning for BERT Sentence Representations", "ACL 2021", "2106.07345",
        """@inproceedings{kim2021selfguided,
  title = {Self-Guided Contrastive Learning for {BERT} Sentence Representations},
  author = {Kim, Taeuk and Yoo, Kang Min and Lee, Sang-goo},
  booktitle = {Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics (ACL)},
  year = {2021}
}""",
        code="https://github.com/galsang/SG-BERT",  # papers/sg-bert.txt, section 4.1
    ),
    "consert": Paper(
        "Yuanmeng Yan, Rumei Li, Sirui Wang, Fuzheng Zhang, Wei Wu, Weiran Xu",
        "ConSERT: A Contrastive Framework for Self-Supervised Sentence Representation Transfer", "ACL 2021",
        "2105.11741",
        """@inproceedings{yan2021consert,
  title = {{ConSERT}: A Contrastive Framework for Self-Supervised Sentence Representation Transfer},
  author = {Yan, Yuanmeng and Li, Rumei and Wang, Sirui and Zhang, Fuzheng and Wu, Wei and Xu, Weiran},
  booktitle = {Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics (ACL)},
  year = {2021}
}""",
        code="https://github.com/yym6472/ConSERT",  # papers/consert.txt, footnote 3
    ),
    "clear": Paper(
        "Zhuofeng Wu, Sinong Wang, Jiatao Gu, Madian Khabsa, Fei Sun, Hao Ma",
        "CLEAR: Contrastive Learning for Sentence Representation", "arXiv preprint 2020", "2012.15466",
        """@article{wu2020clear,
  title = {{CLEAR}: Contrastive Learning for Sentence Representation},
  author = {Wu, Zhuofeng and Wang, Sinong and Gu, Jiatao and Khabsa, Madian and Sun, Fei and Ma, Hao},
  journal = {arXiv preprint arXiv:2012.15466},
  year = {2020}
}""",
    ),
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
    ),
}


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> None:
    """Add a method so that recipes can name it."""
    METHODS[spec.name] = spec


def get_method(name: str) -> MethodSpec:
    if name not in METHODS:
        raise KeyError(f"unknown method '{name}'. Choose one of: {', '.join(sorted(METHODS))}.")
    return METHODS[name]


register_method(
    MethodSpec(
        name="simcse",
        paper="simcse",
        config_path="hf_sentcl.configs.simcse.SimCSEConfig",
        trainer_path="hf_sentcl.trainers.simcse.SimCSETrainer",
        text_columns=("text",),
        summary="Unsupervised SimCSE: dropout views, in-batch InfoNCE (Gao et al. 2021).",
    )
)


register_method(
    MethodSpec(
        name="simcse_sup",
        paper="simcse",
        config_path="hf_sentcl.configs.simcse.SupervisedSimCSEConfig",
        trainer_path="hf_sentcl.trainers.simcse.SupervisedSimCSETrainer",
        text_columns=("sent0", "sent1"),
        optional_text_columns=("hard_neg",),
        summary="Supervised SimCSE on (anchor, entailment[, contradiction]) pairs or triplets.",
    )
)


register_method(
    MethodSpec(
        name="self_guided",
        paper="self_guided",
        config_path="hf_sentcl.configs.self_guided.SelfGuidedConfig",
        trainer_path="hf_sentcl.trainers.self_guided.SelfGuidedTrainer",
        text_columns=("text",),
        summary="Self-guided contrastive learning, SG / SG-OPT: [CLS] vs. a frozen copy's layer views "
        "(Kim et al. 2021).",
        sharded_weights_problem="its frozen copy, projection head and parameter-distance regularizer use the "
        "encoder's weights outside its forward",
    )
)


register_method(
    MethodSpec(
        name="consert",
        paper="consert",
        stage_dirname="stage-1",
        config_path="hf_sentcl.configs.consert.ConSERTConfig",
        trainer_path="hf_sentcl.trainers.consert.ConSERTTrainer",
        text_columns=("text",),
        summary="ConSERT: embedding-level augmentations, NT-Xent; NLI joint/chained settings (Yan et al. 2021).",
        stages_path="hf_sentcl.trainers.consert.consert_stages",
        train_data_path="hf_sentcl.trainers.consert.consert_train_data",
    )
)


register_method(
    MethodSpec(
        name="clear",
        paper="clear",
        config_path="hf_sentcl.configs.clear.CLEARConfig",
        trainer_path="hf_sentcl.trainers.clear.CLEARTrainer",
        text_columns=("text",),
        summary="CLEAR: MLM on the original + NT-Xent between two augmented views (Wu et al. 2020).",
        sharded_weights_problem="its MLM and projection heads run outside the encoder's forward",
    )
)
