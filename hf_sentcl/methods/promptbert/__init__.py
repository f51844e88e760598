"""PromptBERT (Jiang et al. 2022, "PromptBERT: Improving BERT Sentence Embeddings with Prompts"): the sentence vector
is the last hidden state at the [MASK] of a template such as `This sentence : "[X]" means [MASK] .`; unsupervised
training takes the sentence in two different templates as the positive pair, each view's [MASK] state minus the
[MASK] state of its template alone at the same position ids (template denoising) (docs/methods/promptbert.md). One
folder: `config.py` (recipe keys), `trainer.py`, and the registration below; the template machinery the encoder
embeds with everywhere (evaluation, export) is `hf_sentcl.modeling.prompt`."""

from hf_sentcl.registry import MethodSpec, Paper, ReportedSTS

PAPER = Paper(
    "Ting Jiang, Jian Jiao, Shaohan Huang, Zihan Zhang, Deqing Wang, Fuzhen Zhuang, Furu Wei, Haizhen Huang, "
    "Denvy Deng, Qi Zhang",
    "PromptBERT: Improving BERT Sentence Embeddings with Prompts", "EMNLP 2022", "2201.04337",
    """@inproceedings{jiang2022promptbert,
  title = {{PromptBERT}: Improving {BERT} Sentence Embeddings with Prompts},
  author = {Jiang, Ting and Jiao, Jian and Huang, Shaohan and Zhang, Zihan and Wang, Deqing and Zhuang, Fuzhen and
            Wei, Furu and Huang, Haizhen and Deng, Denvy and Zhang, Qi},
  booktitle = {Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  year = {2022}
}""",
    code="https://github.com/kongds/Prompt-BERT",
    reported=(ReportedSTS("unsup-PromptBERT-BERT-base", 78.54, "the authors' README (mean of 5 seeds; the paper's "
                          "abstract's +2.29 over SimCSE's 76.25 agrees)",
                          (71.56, 84.58, 76.98, 84.47, 80.60, 81.60, 69.87)),),
)

#: unsupervised PromptBERT on bert-base-uncased, Spearman x 100 on the SentEval STS test sets ("all" mode): the mean
#: over 5 seeds that the authors' README (github.com/kongds/Prompt-BERT) reports for their released unsup-PromptBERT
#: (the paper's Table of unsupervised results gives the same average, 78.54)
PAPER_STS_BERT_BASE = {
    "STS12": 71.56, "STS13": 84.58, "STS14": 76.98, "STS15": 84.47, "STS16": 80.60,
    "STSBenchmark": 81.60, "SICKRelatedness": 69.87, "avg": 78.54,
}

METHOD = MethodSpec(
    name="promptbert",
    paper=PAPER,
    config_path="hf_sentcl.methods.promptbert.config.PromptBERTConfig",
    trainer_path="hf_sentcl.methods.promptbert.trainer.PromptBERTTrainer",
    text_columns=("text",),
    summary="PromptBERT: the [MASK] state of a template; two templates as positives, template denoising "
    "(Jiang et al. 2022).",
)
