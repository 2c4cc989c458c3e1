"""The DPO loss: completion log-probabilities, the sigmoid / IPO / hinge losses and their metrics.

Computed as TRL's ``DPOTrainer`` computes them (checked to ~1e-6 in loss and gradients by
tests/test_dpo.py): a batch holds ``B`` chosen sequences followed by their ``B`` rejected ones
(prompt + completion each, right-padded), so one forward pass scores both; a sequence's
log-probability is the sum over its completion tokens of ``log p(token | everything before)``,
the prompt masked out. With ``m = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))``:

- sigmoid (Rafailov et al. 2023): ``-log sigmoid(beta m)``; with label smoothing ``eps`` the
  conservative form ``-(1 - eps) log sigmoid(beta m) - eps log sigmoid(-beta m)`` (cDPO, which
  TRL 0.x applied in "sigmoid" and TRL 1.x reaches by weighting its "sigmoid" and "robust" losses);
- ipo (Azar et al. 2023): ``(m' - 1 / (2 beta))^2`` where ``m'`` divides each log-ratio by its
  completion's token count first (TRL's normalisation, confirmed with the IPO authors);
- hinge (SLiC): ``relu(1 - beta m)``.

The metrics are TRL's: ``rewards/chosen`` and ``rewards/rejected`` (``beta`` times each log-ratio),
``rewards/accuracies`` (share of pairs whose chosen reward is higher), ``rewards/margins`` and
``logps/chosen`` / ``logps/rejected``, each a batch mean.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sampan.finetune.dpo_config import DPOConfig


def completion_logps(logits: torch.Tensor, input_ids: torch.Tensor,
                     completion_mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence sum of ``log p(input_ids[t] | input_ids[:t])`` over the positions where
    ``completion_mask`` is 1 (the prompt and padding count nothing), in float32.

    ``logits [n, s, vocab]`` are the model's outputs on ``input_ids [n, s]``; position ``t - 1``
    predicts token ``t``, so the first token of a sequence is never scored.
    """
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:]
    mask = completion_mask[:, 1:].bool()
    # log_softmax then gather, on the scored positions only: padding rows never reach the vocab
    # reduction's backward with a non-zero gradient either way, but skipping them saves the work.
    picked = torch.zeros(targets.shape, dtype=logits.dtype, device=logits.device)
    scored = logits[mask]
    if scored.numel():
        picked = picked.masked_scatter(mask, scored.log_softmax(-1).gather(-1, targets[mask].unsqueeze(-1)).squeeze(-1))
    return picked.sum(dim=1)


@dataclasses.dataclass
class DPOOutput:
    """One batch's DPO loss (a scalar that backpropagates), its per-pair terms and its metrics."""

    loss: torch.Tensor
    losses: torch.Tensor
    metrics: dict[str, float]
    chosen_logps: torch.Tensor
    rejected_logps: torch.Tensor


def dpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
             ref_rejected_logps: torch.Tensor, config: DPOConfig, chosen_tokens: torch.Tensor | None = None,
             rejected_tokens: torch.Tensor | None = None) -> DPOOutput:
    """The DPO loss of ``B`` preference pairs from the policy's and the reference's sequence
    log-probabilities (each ``[B]``). ``chosen_tokens`` / ``rejected_tokens`` (completion token
    counts, ``[B]``) are needed by ``loss_type="ipo"`` only."""
    beta = config.beta
    chosen_logratios = chosen_logps - ref_chosen_logps.to(chosen_logps)
    rejected_logratios = rejected_logps - ref_rejected_logps.to(rejected_logps)
    margin = chosen_logratios - rejected_logratios
    if config.loss_type == "sigmoid":
        eps = config.label_smoothing
        losses = -F.logsigmoid(beta * margin)
        if eps:
            losses = (1 - eps) * losses - eps * F.logsigmoid(-beta * margin)
    elif config.loss_type == "ipo":
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("loss_type='ipo' normalises each log-ratio by its completion's length: pass "
                             "chosen_tokens and rejected_tokens")
        per_token = (chosen_logratios / chosen_tokens.to(margin).clamp(min=1.0)
                     - rejected_logratios / rejected_tokens.to(margin).clamp(min=1.0))
        losses = (per_token - 1 / (2 * beta)) ** 2
    elif config.loss_type == "hinge":
        losses = torch.relu(1 - beta * margin)
    else:  # DPOConfig validates loss_type; this guards a config mutated after construction
        raise ValueError(f"unknown DPO loss_type {config.loss_type!r}")
    with torch.no_grad():
        chosen_rewards, rejected_rewards = beta * chosen_logratios.detach(), beta * rejected_logratios.detach()
        metrics = {
            "rewards/chosen": chosen_rewards.mean().item(),
            "rewards/rejected": rejected_rewards.mean().item(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
            "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
            "logps/chosen": chosen_logps.detach().mean().item(),
            "logps/rejected": rejected_logps.detach().mean().item(),
        }
    return DPOOutput(losses.mean(), losses, metrics, chosen_logps, rejected_logps)


def sequence_logps(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``completion_logps`` of every sequence in ``batch`` (``input_ids``, ``attention_mask``,
    ``completion_mask``) under ``model``, whose ``forward(input_ids, attention_mask)`` returns logits."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    if not isinstance(logits, torch.Tensor):
        logits = logits.logits  # a Hugging Face model's output object
    return completion_logps(logits, batch["input_ids"], batch["completion_mask"])


def precomputed(batch: dict[str, Any]) -> bool:
    """Whether the batch carries the reference log-probabilities (``reference="precomputed"``)."""
    return "ref_chosen_logps" in batch and "ref_rejected_logps" in batch


class Reference:
    """Where a DPO run's reference log-probabilities come from.

    ``model``: a frozen module scored under ``no_grad`` (a copy of the starting weights); or
    ``disable``: a context manager factory that turns the policy into the reference while it is
    open (LoRA switched off: the base, no copy held); or neither, when every batch carries
    precomputed ``ref_chosen_logps`` / ``ref_rejected_logps``.
    """

    def __init__(self, model: nn.Module | None = None,
                 disable: Callable[[nn.Module], contextlib.AbstractContextManager] | None = None):
        if model is not None and disable is not None:
            raise ValueError("a Reference is a frozen model or a way to disable the adapters, not both")
        self.model, self.disable = model, disable
        if model is not None:
            model.eval()
            model.requires_grad_(False)

    @contextlib.contextmanager
    def _scorer(self, policy: nn.Module) -> Iterator[nn.Module]:
        if self.model is not None:
            yield self.model
        elif self.disable is not None:
            with self.disable(policy) as base:
                yield base
        else:
            raise ValueError("this batch has no ref_chosen_logps / ref_rejected_logps and the run has no reference "
                             "model: give the records those fields (DPOConfig.reference='precomputed') or use "
                             "reference='model'")

    @torch.no_grad()
    def logps(self, policy: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's (chosen, rejected) log-probabilities for ``batch``."""
        if precomputed(batch):
            return batch["ref_chosen_logps"], batch["ref_rejected_logps"]
        with self._scorer(policy) as scorer:
            return sequence_logps(scorer, batch).chunk(2)


def batch_loss(policy: nn.Module, reference: Reference, batch: dict[str, Any], config: DPOConfig) -> DPOOutput:
    """The DPO loss of a collated batch (``PreferenceCollator``): ``B`` chosen rows then ``B``
    rejected rows, scored by ``policy`` in one forward pass (gradients flow) and by ``reference``."""
    ref_chosen, ref_rejected = reference.logps(policy, batch)
    chosen, rejected = sequence_logps(policy, batch).chunk(2)
    tokens = batch["completion_mask"].sum(dim=1)
    chosen_tokens, rejected_tokens = tokens.chunk(2)
    return dpo_loss(chosen, rejected, ref_chosen, ref_rejected, config, chosen_tokens, rejected_tokens)
