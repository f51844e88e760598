"""AnglE (Li and Li 2023, "AnglE-optimized Text Embeddings"): scored sentence pairs trained with the weighted sum of
a cosine (CoSENT) term, an in-batch negative term and an angle term that ranks the pairs by their angle difference
in complex space (docs/methods/angle.md). One folder: `config.py` (recipe keys), `loss.py` (the three terms),
`trainer.py`, `data.py` (`sts_train`), and the registration below."""

from hf_sentcl.registry import MethodSpec, Paper

PAPER = Paper(
    "Xianming Li, Jing Li", "AnglE-optimized Text Embeddings", "arXiv preprint 2023", "2309.12871",
    """@article{li2023angle,
  title = {{AnglE}-optimized Text Embeddings},
  author = {Li, Xianming and Li, Jing},
  journal = {arXiv preprint arXiv:2309.12871},
  year = {2023}
}""",
    code="https://github.com/SeanLee97/AnglE",
)

METHOD = MethodSpec(
    name="angle",
    paper=PAPER,
    config_path="hf_sentcl.methods.angle.config.AnglEConfig",
    trainer_path="hf_sentcl.methods.angle.trainer.AnglETrainer",
    text_columns=("sent0", "sent1"),
    score_column="score",
    train_data_path="hf_sentcl.methods.angle.data.angle_train_data",
    summary="AnglE: CoSENT, in-batch and angle terms on scored pairs (sent0, sent1, score) (Li and Li 2023).",
)
