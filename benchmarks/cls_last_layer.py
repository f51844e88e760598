"""What computing only the [CLS] position of the last layer saves: an encoder's training forward and backward with
`[CLS]` pooling, the last layer for every token against the first positions only, alternating in one process.

    HF_SENTCL_DATA=/path/to/senteval python benchmarks/cls_last_layer.py [--precisions bf16,fp32] [--blocks 12]
        [--steps-per-block 4] [--batch-size 64] [--max-seq-length 32] [--model embedded:all-MiniLM-L6-v2]
        [--route unpadded|padded] [--inference]

Both sides run the same encoder (`pooling: cls`, MLP head, fast dropout, training mode) on the same batch: the first
`--batch-size` sentences of the Wikipedia subset (`$HF_SENTCL_DATA/../wiki1m_subset.txt` or --train-file) twice,
as SimCSE's step sees them, through `run_backbone` on the unpadded route (the CPU default; `--route padded`: the
padded route, which GPUs and nearly full batches take) with `first_token_only` on and off, then the head and an
in-batch contrastive loss, backward (`--inference`: the forward alone in eval mode without gradients, as
evaluation runs it). Blocks of steps alternate (A B, B A, ...); the medians of the per-step times and their ratio
are printed. The optimizer is left out: it does not depend on the route.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.modeling.backbone_forward import run_backbone
from hf_sentcl.modeling.fast_dropout import use_fast_dropout

ROUTES = {"full last layer": False, "first positions only": True}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded:all-MiniLM-L6-v2")
    parser.add_argument("--train-file", default=None, help="Default: $HF_SENTCL_DATA/../wiki1m_subset.txt")
    parser.add_argument("--precisions", default="bf16,fp32")
    parser.add_argument("--batch-size", type=int, default=64, help="Sentences per step (each encoded twice).")
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=12, help="Timed blocks per route and precision.")
    parser.add_argument("--steps-per-block", type=int, default=4)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--route", choices=("unpadded", "padded"), default="unpadded")
    parser.add_argument("--inference", action="store_true", help="Time the eval-mode forward without gradients.")
    args = parser.parse_args(argv)
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if set(args.precisions) - {"bf16", "fp32"} or args.batch_size < 2 or args.blocks < 1:
        parser.error("--precisions takes bf16 and/or fp32; --batch-size >= 2; --blocks >= 1.")
    if args.train_file is None:
        args.train_file = str(resolve_data_dir(None).parent / "wiki1m_subset.txt")
    return args


def training_step(encoder: SentenceEncoder, batch: dict, first_token_only: bool, bf16: bool, unpadded: bool) -> None:
    """Forward (SimCSE's two views in one batch), in-batch contrastive loss at tau 0.05, backward; the forward
    alone when the encoder is in eval mode."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), torch.set_grad_enabled(encoder.training):
        states = run_backbone(encoder.backbone, unpadded, **batch, first_token_only=first_token_only)
        embeddings = encoder.head(states.last_hidden_state[:, 0]).float()
    if not encoder.training:
        return
    half = len(embeddings) // 2
    embeddings = F.normalize(embeddings, dim=-1)
    loss = F.cross_entropy(embeddings[:half] @ embeddings[half:].T / 0.05, torch.arange(half))
    loss.backward()
    encoder.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    encoder = SentenceEncoder.from_backbone(args.model, pooling="cls", head="mlp")
    use_fast_dropout(encoder)
    encoder.train(not args.inference)
    unpadded = args.route == "unpadded"
    with open(args.train_file, encoding="utf-8") as handle:
        sentences = [next(handle).strip() for _ in range(args.batch_size)]
    tokens = encoder.tokenizer(sentences * 2, padding=True, truncation=True, max_length=args.max_seq_length,
                               return_tensors="pt")
    batch = {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}
    print(f"{len(sentences) * 2} rows of up to {batch['input_ids'].shape[1]} tokens, "
          f"{int(batch['attention_mask'].sum())} real; {args.threads} threads; {args.route} route, "
          f"{'inference' if args.inference else 'training'}")
    for precision in args.precisions:
        bf16 = precision == "bf16"
        for first_only in ROUTES.values():  # warm-up
            training_step(encoder, batch, first_only, bf16, unpadded)
        seconds: dict[str, list[float]] = {name: [] for name in ROUTES}
        for block in range(args.blocks):
            for name in (list(ROUTES) if block % 2 == 0 else list(reversed(ROUTES))):
                start = time.perf_counter()
                for _ in range(args.steps_per_block):
                    training_step(encoder, batch, ROUTES[name], bf16, unpadded)
                seconds[name].append((time.perf_counter() - start) / args.steps_per_block)
        full, first = (statistics.median(seconds[name]) for name in ROUTES)
        print(f"{precision}: full last layer {full * 1e3:.1f} ms, first positions only {first * 1e3:.1f} ms per "
              f"{'forward' if args.inference else 'forward + backward'} (medians of {args.blocks} blocks of "
              f"{args.steps_per_block}): {full / first:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
