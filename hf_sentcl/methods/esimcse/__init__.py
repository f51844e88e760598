"""ESimCSE (Wu et al. 2022, "ESimCSE: Enhanced Sample Building Method for Contrastive Learning of Unsupervised
Sentence Embedding"): unsupervised SimCSE whose positive is the sentence with a few subword tokens repeated, and whose
negatives include a queue of a momentum encoder's embeddings (docs/methods/esimcse.md). One folder: `config.py`
(recipe keys), `augment.py` (word repetition), `loss.py` (InfoNCE with the queue), `trainer.py`, and the
registration below."""

from hf_sentcl.registry import MethodSpec, Paper, ReportedSTS

PAPER = Paper(
    "Xing Wu, Chaochen Gao, Liangjun Zang, Jizhong Han, Zhongyuan Wang, Songlin Hu",
    "ESimCSE: Enhanced Sample Building Method for Contrastive Learning of Unsupervised Sentence Embedding",
    "COLING 2022", "2109.04380",
    """@inproceedings{wu2022esimcse,
  title = {{ESimCSE}: Enhanced Sample Building Method for Contrastive Learning of Unsupervised Sentence Embedding},
  author = {Wu, Xing and Gao, Chaochen and Zang, Liangjun and Han, Jizhong and Wang, Zhongyuan and Hu, Songlin},
  booktitle = {Proceedings of the 29th International Conference on Computational Linguistics (COLING)},
  year = {2022}
}""",
    code="https://github.com/caskcsg/sentemb",
    reported=(ReportedSTS("ESimCSE-BERT-base", 78.27, "the authors' README (the paper's table not read here; its "
                                                         "abstract's +2.02 over SimCSE's 76.25 agrees)"),),
)

METHOD = MethodSpec(
    name="esimcse",
    paper=PAPER,
    config_path="hf_sentcl.methods.esimcse.config.ESimCSEConfig",
    trainer_path="hf_sentcl.methods.esimcse.trainer.ESimCSETrainer",
    text_columns=("text",),
    summary="ESimCSE: word-repetition positives, momentum-encoder queue negatives (Wu et al. 2022).",
    sharded_weights_problem="its momentum encoder (a moving average of the encoder's weights) and its queue are "
    "used outside the encoder's forward",
)
