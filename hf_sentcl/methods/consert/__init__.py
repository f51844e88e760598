"""ConSERT (Yan et al. 2021, "ConSERT: A Contrastive Framework for Self-Supervised Sentence Representation Transfer"):
embedding-level augmentations and NT-Xent, with NLI supervision jointly or in chained stages
(docs/methods/consert.md). One folder: `config.py` (recipe keys), `trainer.py` (one stage's training step),
`stages.py` (the chained settings and the NLI data of the supervised stages), and the registration below; the
augmentations are shared (`hf_sentcl.augment.embedding`), the losses too (`hf_sentcl.losses`)."""

from hf_sentcl.registry import MethodSpec, Paper, ReportedSTS

PAPER = Paper(
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
    reported=(
        ReportedSTS("ConSERT-base (unsup)", 72.74, "papers/consert.txt Table 2"),
        ReportedSTS("ConSERT-base (joint)", 77.12, "papers/consert.txt Table 3"),
    ),
)

METHOD = MethodSpec(
    name="consert",
    paper=PAPER,
    stage_dirname="stage-1",
    config_path="hf_sentcl.methods.consert.config.ConSERTConfig",
    trainer_path="hf_sentcl.methods.consert.trainer.ConSERTTrainer",
    text_columns=("text",),
    summary="ConSERT: embedding-level augmentations, NT-Xent; NLI joint/chained settings (Yan et al. 2021).",
    stages_path="hf_sentcl.methods.consert.stages.consert_stages",
    train_data_path="hf_sentcl.methods.consert.stages.consert_train_data",
)
