"""CLEAR (Wu et al. 2020, "CLEAR: Contrastive Learning for Sentence Representation"): masked-LM on the original
sentence plus NT-Xent between two augmented views of it (docs/methods/clear.md). One folder: `config.py` (recipe
keys), `collator.py` (the views and the masked original, augmented while batches are collated), `trainer.py`, and
the registration below. The text augmentations stay in `hf_sentcl.augment` (`text.py`, `wordnet.py`, beside
ConSERT's embedding-level ones), the NT-Xent in `hf_sentcl.losses.nt_xent` (ConSERT's and SG's too)."""

from hf_sentcl.registry import MethodSpec, Paper, ReportedSTS

PAPER = Paper(
    "Zhuofeng Wu, Sinong Wang, Jiatao Gu, Madian Khabsa, Fei Sun, Hao Ma",
    "CLEAR: Contrastive Learning for Sentence Representation", "arXiv preprint 2020", "2012.15466",
    """@article{wu2020clear,
  title = {{CLEAR}: Contrastive Learning for Sentence Representation},
  author = {Wu, Zhuofeng and Wang, Sinong and Gu, Jiatao and Khabsa, Madian and Sun, Fei and Ma, Hao},
  journal = {arXiv preprint arXiv:2012.15466},
  year = {2020}
}""",
    # CLEAR's own tables report another protocol; ConSERT's Table 2 quotes it on the 7 STS tasks
    reported=(ReportedSTS("CLEAR-base", 61.8, "papers/consert.txt Table 2 (CLEAR as ConSERT quotes it)",
                          (49.0, 48.9, 57.4, 63.6, 65.6, 75.6, 72.5)),),
)

METHOD = MethodSpec(
    name="clear",
    paper=PAPER,
    config_path="hf_sentcl.methods.clear.config.CLEARConfig",
    trainer_path="hf_sentcl.methods.clear.trainer.CLEARTrainer",
    text_columns=("text",),
    summary="CLEAR: MLM on the original + NT-Xent between two augmented views (Wu et al. 2020).",
    sharded_weights_problem="its MLM and projection heads run outside the encoder's forward",
)
