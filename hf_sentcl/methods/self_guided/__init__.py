"""Self-guided contrastive learning, SG and SG-OPT (Kim et al. 2021, "Self-Guided Contrastive Learning for BERT
Sentence Representations"): the tuned encoder's last-layer [CLS] is pulled towards pooled hidden layers of a frozen
copy of itself (docs/methods/self_guided.md). One folder: `config.py` (recipe keys), `loss.py` (L_base, the
ablations and L_opt), `trainer.py`, and the registration below; the parameter-distance regularizer is shared
(`hf_sentcl.losses.parameter_distance`, which `hf_sentcl.modeling.peft` computes for LoRA too)."""

from hf_sentcl.registry import MethodSpec, Paper, ReportedSTS

PAPER = Paper(
    "Taeuk Kim, Kang Min Yoo, Sang-goo Lee",
    "Self-Guided Contrastive Learning for BERT Sentence Representations", "ACL 2021", "2106.07345",
    """@inproceedings{kim2021selfguided,
  title = {Self-Guided Contrastive Learning for {BERT} Sentence Representations},
  author = {Kim, Taeuk and Yoo, Kang Min and Lee, Sang-goo},
  booktitle = {Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics (ACL)},
  year = {2021}
}""",
    code="https://github.com/galsang/SG-BERT",  # papers/sg-bert.txt, section 4.1
    reported=(ReportedSTS("BERT-base SG-OPT", 74.62, "papers/sg-bert.txt Table 1"),),
)

METHOD = MethodSpec(
    name="self_guided",
    paper=PAPER,
    config_path="hf_sentcl.methods.self_guided.config.SelfGuidedConfig",
    trainer_path="hf_sentcl.methods.self_guided.trainer.SelfGuidedTrainer",
    text_columns=("text",),
    summary="Self-guided contrastive learning, SG / SG-OPT: [CLS] vs. a frozen copy's layer views "
    "(Kim et al. 2021).",
    sharded_weights_problem="its frozen copy, projection head and parameter-distance regularizer use the "
    "encoder's weights outside its forward",
)
