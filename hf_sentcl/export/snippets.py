"""The usage code in a model card: sentence-transformers, and plain transformers that reproduces the same vectors."""

from __future__ import annotations

import inspect
import textwrap

from hf_sentcl.export.plan import ExportPlan
from hf_sentcl.modeling.pooling import masked_max, masked_mean

EXAMPLE_SENTENCES = ("A man is playing a guitar.", "Someone is playing an instrument.", "A cat sleeps on the sofa.")


def _source(function) -> str:
    return textwrap.dedent(inspect.getsource(function))


def transformers_snippet(plan: ExportPlan, model_id: str) -> str:
    """Plain-transformers usage: `embed(sentences)` reproduces the sentence-transformers/hf_sentcl vectors.

    The token reductions are the source of `hf_sentcl.modeling.pooling`'s own functions, and the states they read
    follow `pool` for the plan's mode (the export tests run this snippet against `SentenceEncoder.encode`).
    """
    if plan.prompt_template is not None:
        return _prompt_snippet(plan, model_id)
    reduce = _token_reduction(plan)
    lines = _loading_lines(plan, model_id)
    if reduce is not None:
        lines += ["", "", _source(reduce).rstrip()]
    body = _embed_body(plan, reduce)
    lines += ["", "", "def embed(sentences: list[str]) -> torch.Tensor:", *("    " + line for line in body)]
    lines += [
        "",
        "",
        f"embeddings = embed({list(EXAMPLE_SENTENCES)!r})",
        "print(torch.nn.functional.cosine_similarity(embeddings[:1], embeddings[1:]))",
    ]
    return "\n".join(lines)


PROMPT_EMBED = """
# the sentence goes between the template's tokens, with the tokenizer's special tokens ([CLS] ... [SEP]) around all
before, after = TEMPLATE.replace("[MASK]", tokenizer.mask_token).split("[X]")
inner, outer = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
start = next(i for i in range(len(outer)) if outer[i : i + len(inner)] == inner)
plain = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"] if text else []  # noqa: E731
prefix, suffix = outer[:start] + plain(before), plain(after) + outer[start + len(inner) :]


def embed(sentences: list[str]) -> torch.Tensor:
    room = max(MAX_LENGTH - len(prefix) - len(suffix), 0)  # the sentence is cut, never the template
    rows = [prefix + ids[:room] + suffix for ids in tokenizer(sentences, add_special_tokens=False)["input_ids"]]
    batch = tokenizer.pad({"input_ids": rows}, return_tensors="pt")
    with torch.inference_mode():
        states = model(**batch).last_hidden_state
    at_mask = (batch["input_ids"] == tokenizer.mask_token_id).int().argmax(dim=1)  # the template's [MASK]
    return states[torch.arange(len(states)), at_mask]
"""


def _prompt_snippet(plan: ExportPlan, model_id: str) -> str:
    """Plain-transformers usage of a prompt-pooling export (PromptBERT): the sentence written into the template, the
    last-layer state at its [MASK] (what `hf_sentcl.modeling.prompt` computes; no sentence-transformers files)."""
    lines = _loading_lines(plan, model_id) + [
        f"TEMPLATE = {plan.prompt_template!r}  # [X]: the sentence; the vector: the state at [MASK]",
        f"MAX_LENGTH = {plan.max_seq_length}",
    ]
    return "\n".join(lines) + PROMPT_EMBED + "\n\n" + "\n".join([
        f"embeddings = embed({list(EXAMPLE_SENTENCES)!r})",
        "print(torch.nn.functional.cosine_similarity(embeddings[:1], embeddings[1:]))",
    ])


def _token_reduction(plan: ExportPlan):
    """The pooling function over token states the snippet defines, or None where it reads one state ([CLS]) or
    the pooler."""
    if plan.head == "pooler" or plan.mode.token_pooling == "cls":
        return None
    return masked_max if plan.mode.token_pooling == "max" else masked_mean


def _loading_lines(plan: ExportPlan, model_id: str) -> list[str]:
    """Imports, tokenizer and model, and the Dense head's weights when the export keeps one at inference."""
    lines = [
        "import torch",
        "from transformers import AutoModel, AutoTokenizer",
        "",
        f'model_id = "{model_id}"',
        "tokenizer = AutoTokenizer.from_pretrained(model_id)",
        "model = AutoModel.from_pretrained(model_id).eval()",
    ]
    if plan.head != "dense":
        return lines
    dense_path = f"{plan.module_dirs['Dense']}/model.safetensors"
    return lines + [
        "",
        "# The trained Linear+tanh head is stored as the sentence-transformers Dense module.",
        "import os",
        "from huggingface_hub import hf_hub_download",
        "from safetensors.torch import load_file",
        "",
        f'dense_file = os.path.join(model_id, "{dense_path}") if os.path.isdir(model_id) '
        f'else hf_hub_download(model_id, "{dense_path}")',
        "dense = load_file(dense_file)",
    ]


def _embed_body(plan: ExportPlan, reduce) -> list[str]:
    """The lines of `embed`: tokenise, run the model, read the plan's states, pool, apply the head."""
    mode = plan.mode
    body = [
        f"batch = tokenizer(sentences, padding=True, truncation=True, max_length={plan.max_seq_length}, "
        'return_tensors="pt")',
        "with torch.inference_mode():",
        f"    outputs = model(**batch{', output_hidden_states=True' if mode.averaged_state is not None else ''})",
    ]
    if plan.head == "pooler":
        body.append("embeddings = outputs.pooler_output  # [CLS] through the trained head, folded into the pooler")
    elif mode.averaged_state is not None:
        body += [
            f"states = (outputs.hidden_states[{mode.averaged_state}] + outputs.hidden_states[-1]) / 2",
            f'embeddings = {reduce.__name__}(states, batch["attention_mask"])',
        ]
    elif reduce is None:
        body.append("embeddings = outputs.last_hidden_state[:, 0]  # [CLS] state")
    else:
        body.append(f'embeddings = {reduce.__name__}(outputs.last_hidden_state, batch["attention_mask"])')
    if plan.head == "dense":
        body.append('embeddings = torch.tanh(embeddings @ dense["linear.weight"].T + dense["linear.bias"])')
    if plan.normalize:
        body.append("embeddings = torch.nn.functional.normalize(embeddings, dim=-1)  # the Normalize module")
    body.append("return embeddings")
    return body


def sentence_transformers_snippet(model_id: str) -> str:
    return textwrap.dedent(
        f"""\
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer("{model_id}")
        embeddings = model.encode({list(EXAMPLE_SENTENCES)!r})
        print(model.similarity(embeddings, embeddings))"""
    )
