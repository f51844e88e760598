"""The guide encoder of `false_negatives: guide`: a frozen model that names each text view by its unit embedding,
so that the loss can drop the in-batch candidates it scores as closer to an anchor than the anchor's own positive
(`hf_sentcl.losses.false_negatives`; sentence-transformers' GISTEmbedLoss, here for every method).

It runs without gradient in eval mode, once per step over the texts the loss names (before augmentation where a
method augments: the method's `identity_tokens`), in whatever precision the step's autocast sets. Token ids are fed
to it directly when it shares the training tokenizer's vocabulary and length; otherwise the texts are decoded and
re-tokenised with its own tokenizer, as GISTEmbedLoss does.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from hf_sentcl.modeling.encoder import SentenceEncoder, load_encoder

logger = logging.getLogger("hf_sentcl")


class Guide:
    """A frozen `SentenceEncoder` that embeds the training batch's token ids for the guided false-negative mask."""

    def __init__(self, encoder: SentenceEncoder, training_tokenizer: PreTrainedTokenizerBase):
        self.encoder = encoder.eval().requires_grad_(False)
        self.training_tokenizer = training_tokenizer
        self.same_vocabulary = training_tokenizer.get_vocab() == encoder.tokenizer.get_vocab()

    @classmethod
    def load(
        cls, name_or_path: str, training_tokenizer: PreTrainedTokenizerBase, device: torch.device | str = "cpu"
    ) -> Guide:
        """Load `guide_model` (folder, Hub id or the embedded alias) with its own pooling and length; ValueError naming
        the key when it cannot be loaded."""
        try:
            encoder = load_encoder(name_or_path)
        except (OSError, ValueError) as err:
            raise ValueError(f"guide_model '{name_or_path}' could not be loaded: {err}") from err
        guide = cls(encoder.to(device), training_tokenizer)
        logger.info(
            "Guide model %s: %s pooling, %d tokens, %s.", name_or_path, encoder.config.pooling,
            encoder.max_seq_length, "same vocabulary" if guide.same_vocabulary else "re-tokenises the decoded texts",
        )
        return guide

    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(rows, guide dim) unit-length fp32 embeddings of the texts whose training token ids are `input_ids`
        (rows, length), padded where `attention_mask` is 0."""
        device = self.encoder.device
        if self.same_vocabulary and input_ids.shape[-1] <= self.encoder.max_seq_length:
            batch = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
        else:
            texts = self.training_tokenizer.batch_decode(
                input_ids.masked_fill(attention_mask == 0, self.training_tokenizer.pad_token_id or 0),
                skip_special_tokens=True,
            )
            batch = self.encoder.tokenizer(
                texts, padding=True, truncation=True, max_length=self.encoder.max_seq_length, return_tensors="pt",
                return_token_type_ids=False,
            ).to(device)
        embeddings = self.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).embeddings
        return F.normalize(embeddings.float(), dim=-1)
