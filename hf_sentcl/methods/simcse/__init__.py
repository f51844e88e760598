"""SimCSE (Gao et al. 2021, "SimCSE: Simple Contrastive Learning of Sentence Embeddings"): in-batch InfoNCE between
two dropout views of each sentence (`simcse`), or between NLI anchors and their entailments with the contradictions
as hard negatives (`simcse_sup`) (docs/methods/simcse.md). One folder for both recipe names, which share the paper,
the docs page and the modules: `config.py` (recipe keys), `trainer.py` (both trainers), and the registrations
below (`METHODS`, two specs); the loss is shared (`hf_sentcl.losses.margin.margin_info_nce`, InfoNCE with the
optional IFM/BYOP margin)."""

from hf_sentcl.registry import MethodSpec, Paper, ReportedSTS

PAPER = Paper(
    "Tianyu Gao, Xingcheng Yao, Danqi Chen",
    "SimCSE: Simple Contrastive Learning of Sentence Embeddings", "EMNLP 2021", "2104.08821",
    """@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  year = {2021}
}""",
    code="https://github.com/princeton-nlp/SimCSE",
    reported=(
        ReportedSTS("unsup-SimCSE-BERT-base", 76.25, "SimCSE Table 5",
                    (68.40, 82.41, 74.38, 80.91, 78.56, 76.85, 72.23)),
        ReportedSTS("sup-SimCSE-BERT-base", 81.57, "SimCSE Table 5",
                    (75.30, 84.67, 80.19, 85.40, 80.82, 84.25, 80.39)),
    ),
)

METHODS = (
    MethodSpec(
        name="simcse",
        paper=PAPER,
        config_path="hf_sentcl.methods.simcse.config.SimCSEConfig",
        trainer_path="hf_sentcl.methods.simcse.trainer.SimCSETrainer",
        text_columns=("text",),
        summary="Unsupervised SimCSE: dropout views, in-batch InfoNCE (Gao et al. 2021).",
    ),
    MethodSpec(
        name="simcse_sup",
        paper=PAPER,
        docs_page="simcse",
        config_path="hf_sentcl.methods.simcse.config.SupervisedSimCSEConfig",
        trainer_path="hf_sentcl.methods.simcse.trainer.SupervisedSimCSETrainer",
        text_columns=("sent0", "sent1"),
        optional_text_columns=("hard_neg",),
        summary="Supervised SimCSE on (anchor, entailment[, contradiction]) pairs or triplets.",
    ),
)
