"""`SentenceEncoderConfig`: everything that decides what the encoder computes, saved with the checkpoint."""

from __future__ import annotations

from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from hf_sentcl.configs.choices import HEAD_TYPES, pooling_mode


class SentenceEncoderConfig(PreTrainedConfig):
    """Configuration of a `SentenceEncoder`.

    Pooling and head settings live here (not in constructor kwargs) so that a checkpoint reloads and embeds the
    same way without the recipe that trained it.

    Args:
        backbone_config: config of the wrapped `AutoModel` backbone (BERT, RoBERTa, MiniLM, ...).
        pooling: one of `POOLING_MODES`. `cls` is the [CLS] vector passed through the head when one is active;
            `cls_before_pooler` is the raw [CLS] vector, never through the head; `mean`/`max` pool real tokens;
            `first_last_avg` mean-pools the average of the first transformer layer and the last;
            `last2_avg` mean-pools the average of the last two layers.
        pooling_layer: hidden-state index used by `cls`, `cls_before_pooler`, `mean` and `max` (0 = embedding
            output, -1 = last layer).
        head: `none` or `mlp` (Linear + tanh on the pooled vector, SimCSE's projector).
        head_at_inference: keep applying the head in eval mode; `False` makes it a training-only head.
        inference_pooling: pooling used in eval mode (and so by `encode` and the saved encoder) when it differs
            from the training pooling, e.g. ConSERT trains with `mean` and evaluates with `last2_avg`.
        max_seq_length: truncation length used by `encode` (defaults to the tokenizer's limit, capped at 512).
        peft: LoRA settings (`peft.LoraConfig` keys) when the backbone carries adapters (a checkpoint saved while
            training with a recipe's `peft:` section); None for a plain backbone (also after merging).
        unpadded: run BERT-family backbones padding-free (token-wise work on the real tokens only, see
            `hf_sentcl.modeling.unpadded`) in training and `encode`; same results as the padded forward up to fp32
            rounding. False always runs the backbone's own padded forward. Other backbones are always padded.
        prompt_template: with `prompt` pooling, the template every sentence is written into (one `[X]` for the
            sentence, one `[MASK]` whose last-layer state is the vector; `hf_sentcl.modeling.prompt`), e.g. PromptBERT's
            `This sentence : "[X]" means [MASK] .`; None otherwise.
        prompt_mask_token_id: the tokenizer's mask token id that `prompt` pooling reads (set with the template).
        matryoshka_dims: the leading sizes of the embedding the encoder was trained to be used at (a recipe's
            `matryoshka_dims`); evaluation scores each prefix and the export and its card state them.
    """

    model_type = "sentence_encoder"
    sub_configs_defaults = {"backbone_config": SubConfigSpec(config_class=AutoConfig, model_type="bert")}

    backbone_config: dict | PreTrainedConfig | None = None
    pooling: str = "cls"
    pooling_layer: int = -1
    head: str = "none"
    head_at_inference: bool = False
    inference_pooling: str | None = None
    max_seq_length: int | None = None
    peft: dict | None = None
    unpadded: bool = True
    matryoshka_dims: list[int] | None = None
    prompt_template: str | None = None
    prompt_mask_token_id: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        for name in ("pooling", "inference_pooling"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, pooling_mode(value, name).value)  # a plain string in the saved config
        if self.head not in HEAD_TYPES:
            raise ValueError(f"Unknown head '{self.head}'. Choose one of: {', '.join(HEAD_TYPES)}.")
        num_states = self.backbone_config.num_hidden_layers + 1
        if not -num_states <= self.pooling_layer < num_states:
            raise ValueError(
                f"pooling_layer={self.pooling_layer} is out of range for a backbone with "
                f"{num_states - 1} layers (use 0..{num_states - 1}, or negative indices from the end)."
            )

    @property
    def hidden_size(self) -> int:
        return self.backbone_config.hidden_size

    def active_pooling(self, training: bool) -> str:
        """The pooling mode in force in training or in eval mode."""
        return self.pooling if training or self.inference_pooling is None else self.inference_pooling

    def needs_all_hidden_states(self, pooling: str) -> bool:
        """Whether `pooling` reads layers other than the last one (costs memory, so only asked for when needed)."""
        last = self.backbone_config.num_hidden_layers
        return pooling_mode(pooling).averaged_state is not None or self.pooling_layer not in (-1, last)


AutoConfig.register(SentenceEncoderConfig.model_type, SentenceEncoderConfig)
