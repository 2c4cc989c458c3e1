"""What knowledge masking is meant to improve, measured on held-out rows of a data build.

* **whole-entity cloze**: every token of one gold PER / LOC entity (People's Daily) is replaced
  by ``[MASK]``; the entity counts as right only if every token is predicted right. One entity
  is masked per example, the rest of the row stays visible.
* **character MLM accuracy**: ordinary BERT-style masking (15% of single tokens, all ``[MASK]``),
  fixed by a seed; accuracy over the masked tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from sampan.pretraining.batches import MLMBatcher
from sampan.text.masking import IGNORE_INDEX, KnowledgeMasker, MaskingConfig
from sampan.text.spans import GOLD_ENTITY_BEGIN, IN_GOLD_ENTITY
from sampan.text.tokenizer import MASK_ID
from sampan.utils.device import device_of


def gold_entity_spans(flags: np.ndarray) -> list[tuple[int, int]]:
    """Token spans ``(start, end)`` of the gold PER / LOC entities in one row's flags."""
    spans, start = [], None
    for i, f in enumerate(np.asarray(flags)):
        if start is not None and (not f & IN_GOLD_ENTITY or f & GOLD_ENTITY_BEGIN):
            spans.append((start, i))
            start = None
        if f & GOLD_ENTITY_BEGIN:
            start = i
    if start is not None:
        spans.append((start, len(flags)))
    return spans


@torch.no_grad()
def predict_masked(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """An ERNIE MLM model's argmax token at each labelled position of ``batch`` (row-major order)."""
    device = device_of(model)
    batch = {k: v.to(device) for k, v in batch.items()}
    labels = batch.pop("labels")
    hidden, _ = model.ernie(**batch)
    return model.lm_head(hidden[labels != IGNORE_INDEX]).argmax(-1).cpu()


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


@torch.no_grad()
def entity_cloze_accuracy(model, dataset, batcher: MLMBatcher, max_entities: int = 2000,
                          batch_size: int = 32) -> dict[str, float]:
    """Share of gold entities (at most ``max_entities``, in row order) predicted entirely right."""
    examples = []
    for row in range(len(dataset)):
        ids, flags = dataset.row(row)
        for s, e in gold_entity_spans(flags):
            examples.append((ids, s, e))
            if len(examples) >= max_entities:
                break
        if len(examples) >= max_entities:
            break
    if not examples:
        raise ValueError("no gold PER/LOC entities in this dataset: evaluate on a data build's news test split")
    was_training = model.training
    model.eval()
    right = right_tokens = tokens = 0
    try:
        for chunk in _batches(examples, batch_size):
            original = np.stack([ids for ids, _, _ in chunk])
            masked, labels = original.copy(), np.full_like(original, IGNORE_INDEX)
            for k, (_, s, e) in enumerate(chunk):
                masked[k, s:e] = MASK_ID
                labels[k, s:e] = original[k, s:e]
            predicted = predict_masked(model, batcher.finish(original, masked, labels)).numpy()
            truth = labels[labels != IGNORE_INDEX]
            hit = predicted == truth
            ends = np.cumsum([e - s for _, s, e in chunk])
            right += sum(bool(part.all()) for part in np.split(hit, ends[:-1]))
            right_tokens += int(hit.sum())
            tokens += len(truth)
    finally:
        model.train(was_training)
    return {"entity_accuracy": right / len(examples), "entity_token_accuracy": right_tokens / tokens,
            "entities": len(examples)}


@torch.no_grad()
def char_mlm_accuracy(model, dataset, batcher: MLMBatcher, max_rows: int = 512, seed: int = 0,
                      batch_size: int = 32) -> dict[str, float]:
    """Accuracy on 15% single-token ``[MASK]`` positions of the first ``max_rows`` rows (seeded)."""
    masker = KnowledgeMasker(batcher.masker.vocab_size, MASK_ID, MaskingConfig(mask_token_prob=1.0,
                                                                               random_token_prob=0.0))
    rows = list(range(min(len(dataset), max_rows)))
    was_training = model.training
    model.eval()
    right = total = 0
    try:
        for chunk in _batches(rows, batch_size):
            pairs = [dataset.row(r) for r in chunk]
            original = np.stack([p[0] for p in pairs])
            flags = np.stack([p[1] for p in pairs])
            masked, labels = masker.mask(original, flags, "char", np.random.default_rng([seed, chunk[0]]))
            predicted = predict_masked(model, batcher.finish(original, masked, labels)).numpy()
            truth = labels[labels != IGNORE_INDEX]
            right += int((predicted == truth).sum())
            total += len(truth)
    finally:
        model.train(was_training)
    return {"char_accuracy": right / max(total, 1), "masked_tokens": total}


@torch.no_grad()
def output_similarity(model, dataset, batcher: MLMBatcher, max_rows: int = 64, max_tokens: int = 1024,
                      seed: int = 0) -> dict[str, float]:
    """Mean cosine similarity between the encoder's outputs at different tokens of held-out rows.

    Early in MLM pretraining the cheapest way down the loss is to predict the unigram
    distribution everywhere, which an encoder does by giving the same output whatever its input:
    the similarity nears 1.0 and fine-tuning from it cannot beat chance (nothing of the input
    reaches the head). A random-init ERNIE scores well below that (the tests check < 0.8).
    Tokens are sampled (seeded) from the first ``max_rows`` rows, unmasked, padding excluded.
    """
    rows = list(range(min(len(dataset), max_rows)))
    was_training = model.training
    model.eval()
    outputs = []
    try:
        for chunk in _batches(rows, 32):
            ids = np.stack([dataset.row(r)[0] for r in chunk])
            batch = batcher.finish(ids, ids, np.full_like(ids, IGNORE_INDEX))
            batch.pop("labels")
            batch = {k: v.to(device_of(model)) for k, v in batch.items()}
            hidden, _ = model.ernie(**batch)
            outputs.append(hidden[batch["attention_mask"].bool()].float().cpu())
    finally:
        model.train(was_training)
    tokens = torch.cat(outputs)
    pick = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(seed))[:max_tokens]
    unit = torch.nn.functional.normalize(tokens[pick].float(), dim=-1)
    sims = unit @ unit.T
    n = len(unit)
    return {"token_output_cosine": float((sims.sum() - sims.diagonal().sum()) / max(n * (n - 1), 1)),
            "tokens": n}
