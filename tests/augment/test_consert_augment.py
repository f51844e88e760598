"""ConSERT's embedding-level augmentations (Yan et al. 2021) on tiny BERT and RoBERTa: shuffle, token and
feature cutoff, dropout, the per-block plan, and the FGV perturbation."""

import math
import types

import pytest
import torch
from helpers import SENTENCES, batch_of
from torch import nn

from hf_sentcl import SentenceEncoder
from hf_sentcl.augment.embedding import (
    AugmentationRates,
    EmbeddingAugmenter,
    fgv_perturbation,
    random_subset,
    shuffled_order,
)
from hf_sentcl.methods.consert.trainer import (
    disable_dropout,
)


def tiny_encoder(backbone_dir, **kwargs) -> SentenceEncoder:
    encoder = SentenceEncoder.from_backbone(str(backbone_dir), pooling="mean", head="none", **kwargs)
    disable_dropout(encoder.backbone)  # the encoder's own dropout off, as in ConSERT: outputs are deterministic
    return encoder.train()




def embedding_run(encoder, augmenter, batch, names):
    """The embedding output and the position ids the position embedding saw, under a plan for `names`."""
    seen = []
    handle = encoder.backbone.embeddings.position_embeddings.register_forward_hook(
        lambda module, args, output: seen.append(args[0].detach().clone())
    )
    try:
        copies = len(names)
        with augmenter.augment(names, batch["attention_mask"].repeat(copies, 1)) as plan:
            encoder(input_ids=batch["input_ids"].repeat(copies, 1), attention_mask=plan.attention_mask)
    finally:
        handle.remove()
    return plan.embedding_output, seen[0], plan


def reference_output(encoder, batch, position_ids=None):
    """The embedding module's own output, without any plan (optionally with explicit position ids)."""
    extra = {} if position_ids is None else {"position_ids": position_ids}
    return encoder.backbone.embeddings(input_ids=batch["input_ids"], **extra)


def augment_once(backbone_dir, names, seed, **rates):
    """A tiny encoder's embedding output under `names` (one block per name), next to its unaugmented output."""
    torch.manual_seed(seed)
    encoder = tiny_encoder(backbone_dir)
    augmenter = EmbeddingAugmenter(encoder.backbone, AugmentationRates(**rates))
    batch = batch_of(encoder)
    output, positions, plan = embedding_run(encoder, augmenter, batch, names)
    return types.SimpleNamespace(
        encoder=encoder, augmenter=augmenter, batch=batch, reference=reference_output(encoder, batch),
        output=output, positions=positions, plan=plan, real=batch["attention_mask"].sum(dim=1).tolist(),
    )


# ------------------------------------------------------------------------------------------ augmentations
def test_shuffle_permutes_the_position_ids_of_real_tokens_only(tiny_backbone_dir):
    """Real tokens get a permutation of their own position ids (BERT 0.., RoBERTa padding_idx+1..); padding keeps
    its ids; token ids keep their order; the output is the embedding module's output for those position ids."""
    run = augment_once(tiny_backbone_dir, ["shuffle"], seed=0)
    _, default_ids, _ = embedding_run(run.encoder, run.augmenter, run.batch, ["none"])
    default_ids, shuffled = default_ids.expand(len(SENTENCES), -1), run.positions
    mask = run.batch["attention_mask"].bool()
    for row in range(len(SENTENCES)):
        real = mask[row]
        assert sorted(shuffled[row, real].tolist()) == sorted(default_ids[row, real].tolist())
        assert torch.equal(shuffled[row, ~real], default_ids[row, ~real])
    assert not torch.equal(shuffled[0], default_ids[0])  # the long sentence is really shuffled
    embeddings = run.encoder.backbone.embeddings
    if getattr(embeddings, "padding_idx", None) is not None:  # RoBERTa numbering
        assert shuffled[mask].min() == embeddings.padding_idx + 1
    torch.testing.assert_close(run.output, reference_output(run.encoder, run.batch, shuffled), rtol=0, atol=0)


@pytest.mark.parametrize("rate", [0.15, 0.4])
def test_token_cutoff_zeroes_floor_rate_of_real_token_rows(tiny_backbone_dir, rate):
    run = augment_once(tiny_backbone_dir, ["token_cutoff"], seed=1, token_cutoff=rate)
    zero_rows = (run.output == 0).all(dim=-1)
    for row, n in enumerate(run.real):
        assert zero_rows[row, :n].sum().item() == math.floor(n * rate)
        assert not zero_rows[row, n:].any()  # padding untouched
        kept = ~zero_rows[row]
        assert torch.equal(run.output[row, kept], run.reference[row, kept])
    assert torch.equal(run.plan.attention_mask, run.batch["attention_mask"])  # ConSERT: attention unchanged


def test_token_cutoff_can_mask_attention(tiny_backbone_dir):
    """token_cutoff_masks_attention: the cut tokens also leave the attention mask the model (and pooling) gets."""
    run = augment_once(tiny_backbone_dir, ["token_cutoff"], seed=2, token_cutoff=0.3, token_cutoff_masks_attention=True)
    cut = (run.output == 0).all(dim=-1) & run.batch["attention_mask"].bool()
    assert cut.any()
    assert torch.equal(run.plan.attention_mask, run.batch["attention_mask"].masked_fill(cut, 0))


@pytest.mark.parametrize("rate", [0.2, 0.5])
def test_feature_cutoff_zeroes_floor_rate_of_dimensions_on_real_tokens(tiny_backbone_dir, rate):
    run = augment_once(tiny_backbone_dir, ["feature_cutoff"], seed=3, feature_cutoff=rate)
    output, reference = run.output, run.reference
    for row, n in enumerate(run.real):
        zero_columns = (output[row, :n] == 0).all(dim=0)
        assert zero_columns.sum().item() == math.floor(output.shape[-1] * rate)
        assert torch.equal(output[row, :n, ~zero_columns], reference[row, :n, ~zero_columns])
        assert torch.equal(output[row, n:], reference[row, n:])  # padding untouched


def test_dropout_zeroes_floor_rate_of_real_elements_without_rescaling(tiny_backbone_dir):
    run = augment_once(tiny_backbone_dir, ["dropout"], seed=4, dropout=0.2)
    output, reference = run.output, run.reference
    assert (reference != 0).all()
    for row, n in enumerate(run.real):
        dropped = output[row, :n] == 0
        assert dropped.sum().item() == math.floor(n * output.shape[-1] * 0.2)
        assert not dropped.all(dim=-1).all() and not dropped.all(dim=0).any()  # elements, not rows or columns
        assert torch.equal(output[row, :n][~dropped], reference[row, :n][~dropped])  # no 1/(1-p) rescaling
        assert torch.equal(output[row, n:], reference[row, n:])


def test_each_block_gets_its_own_augmentation(tiny_backbone_dir):
    """Rows are split into equal blocks, one augmentation per block, in one forward pass."""
    run = augment_once(tiny_backbone_dir, ["none", "token_cutoff", "shuffle"], seed=5, token_cutoff=0.4)
    b = len(SENTENCES)
    assert torch.equal(run.output[:b], run.reference)
    assert (run.output[b : 2 * b] == 0).all(dim=-1).any()
    block0 = reference_output(run.encoder, run.batch, run.positions[:b])
    assert torch.equal(block0, run.reference)  # block 0 kept the default positions
    assert not torch.equal(run.positions[2 * b], run.positions[0])


def test_augmentations_are_inactive_in_eval_mode(tiny_backbone_dir):
    """In eval mode (evaluation, encode) an active plan changes nothing: same embeddings, same sentence vectors."""
    torch.manual_seed(6)
    encoder = tiny_encoder(tiny_backbone_dir).eval()
    rates = AugmentationRates(token_cutoff=0.5, feature_cutoff=0.5, dropout=0.5)
    augmenter = EmbeddingAugmenter(encoder.backbone, rates)
    batch = batch_of(encoder)
    with torch.no_grad():
        plain = encoder(**batch).embeddings
        for names in (["shuffle"], ["token_cutoff"], ["feature_cutoff"], ["dropout"]):
            with augmenter.augment(names, batch["attention_mask"]) as plan:
                augmented = encoder(**batch).embeddings
            assert plan.embedding_output is None
            assert torch.equal(augmented, plain), names
    encoder.train()
    with torch.no_grad(), augmenter.augment(["token_cutoff"], batch["attention_mask"]):
        assert not torch.equal(encoder(**batch).embeddings, plain)


def test_random_subset_is_exact_and_uniform():
    """floor(rate * candidates) per row, only among candidates, every candidate equally likely."""
    torch.manual_seed(7)
    candidates = torch.tensor([[True] * 10 + [False] * 6, [True] * 3 + [False] * 13])
    counts = torch.zeros(16)
    for _ in range(2000):
        chosen = random_subset(candidates, 0.35)
        assert chosen.sum(dim=1).tolist() == [3, 1]
        assert not (chosen & ~candidates).any()
        counts += chosen[0].float()
    frequency = counts[:10] / 2000
    assert torch.allclose(frequency, torch.full((10,), 0.3), atol=0.05)


def test_shuffled_order_keeps_padding_on_either_side():
    torch.manual_seed(8)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    order = shuffled_order(mask)
    for row in range(2):
        real = mask[row].bool()
        assert sorted(order[row, real].tolist()) == torch.nonzero(real).flatten().tolist()
        assert torch.equal(order[row, ~real], torch.nonzero(~real).flatten())


def test_plan_must_match_the_batch(tiny_bert_dir):
    encoder = tiny_encoder(tiny_bert_dir)
    augmenter = EmbeddingAugmenter(encoder.backbone)
    batch = batch_of(encoder)
    with pytest.raises(ValueError, match="equal augmentation blocks"):
        with augmenter.augment(["none", "shuffle"], batch["attention_mask"][:1]):
            pass
    with pytest.raises(RuntimeError, match="augmentation plan"):
        with augmenter.augment(["dropout"], batch["attention_mask"][:2]):
            encoder(**batch)
    with pytest.raises(ValueError, match="augmentation must be one of"):
        with augmenter.augment(["cutout"], batch["attention_mask"]):
            pass


def test_shuffle_needs_absolute_position_embeddings():
    embeddings = nn.Linear(2, 2)  # an embedding module without position_embeddings
    backbone = types.SimpleNamespace(embeddings=embeddings, config=types.SimpleNamespace(hidden_size=2))
    augmenter = EmbeddingAugmenter(backbone)
    with pytest.raises(ValueError, match="position_embeddings"):
        with augmenter.augment(["shuffle"], torch.ones(1, 3, dtype=torch.long)):
            pass
    with pytest.raises(ValueError, match="no `embeddings` module"):
        EmbeddingAugmenter(types.SimpleNamespace(config=None))


def test_fgv_perturbation_has_norm_epsilon_per_sentence():
    """epsilon * g / ||g||: per-sentence L2 norm epsilon over real tokens, parallel to g, zero on padding."""
    gradient = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(9))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    r = fgv_perturbation(gradient, mask, 0.5)
    assert (r[0, 3] == 0).all() and (r[1, 2:] == 0).all()
    for row in range(2):
        real = mask[row].bool()
        assert r[row, real].norm().item() == pytest.approx(0.5, rel=1e-6)
        ratio = r[row, real] / gradient[row, real]
        assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio)) and ratio.flatten()[0] > 0
