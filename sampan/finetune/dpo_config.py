"""``DPOConfig``: the preference-tuning settings of ``sampan finetune --task dpo``, typed and validated.

``FinetuneConfig`` nests it (``--dpo.beta 0.2``); the rest of a DPO run (the base model, the method,
the Trainer's steps and learning rate) is the fine-tune's own.
"""

from __future__ import annotations

import dataclasses

LOSS_TYPES = ("sigmoid", "ipo", "hinge")
REFERENCES = ("model", "precomputed")
# The record fields that carry precomputed reference log-probabilities (reference="precomputed").
REF_CHOSEN_FIELD, REF_REJECTED_FIELD = "ref_chosen_logps", "ref_rejected_logps"


@dataclasses.dataclass
class DPOConfig:
    """Direct Preference Optimization (Rafailov et al. 2023), as TRL's ``DPOTrainer`` computes it.

    Fields:
        beta: how far the policy may move from the reference: the implicit reward of a completion
            is ``beta * (log pi(y|x) - log ref(y|x))``. Larger keeps the policy closer to the
            reference (for "ipo" it is the regulariser tau, the target margin being ``1 / (2 beta)``).
        loss_type: "sigmoid" (DPO's ``-log sigmoid(beta * margin)``), "ipo" (the squared distance of
            the log-ratio margin from ``1 / (2 beta)``, Azar et al. 2023) or "hinge" (SLiC's
            ``relu(1 - beta * margin)``).
        label_smoothing: conservative DPO: the share of preference pairs assumed flipped (the loss
            is ``(1 - eps) * -log sigmoid(beta m) + eps * -log sigmoid(-beta m)``); "sigmoid" only,
            in [0, 0.5).
        reference: where the reference log-probabilities come from. "model": a frozen copy of the
            starting weights (with method="lora" the base itself with the adapters switched off, so
            no copy is held); "precomputed": the records carry ``ref_chosen_logps`` and
            ``ref_rejected_logps`` (sums over the completion tokens), and no reference model is run.
        max_prompt_length: the longest prompt in tokens (its chat-template rendering); a longer one
            keeps its last tokens, the ones next to the completion. None: prompts are cut only so
            prompt + completion fit ``max_length``.
    """

    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    reference: str = "model"
    max_prompt_length: int | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, field: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"DPOConfig.{field} {rule}, got {getattr(self, field)!r}")

        number = (int, float)
        need(isinstance(self.beta, number) and not isinstance(self.beta, bool) and self.beta > 0, "beta",
             "must be a number > 0 (TRL's default is 0.1)")
        need(self.loss_type in LOSS_TYPES, "loss_type", f"must be one of {list(LOSS_TYPES)}")
        need(self.reference in REFERENCES, "reference",
             f"must be one of {list(REFERENCES)} ('model': a frozen copy of the start; 'precomputed': "
             f"{REF_CHOSEN_FIELD} / {REF_REJECTED_FIELD} in each record)")
        need(isinstance(self.label_smoothing, number) and 0.0 <= self.label_smoothing < 0.5, "label_smoothing",
             "must be in [0, 0.5) (the share of pairs assumed flipped)")
        need(self.label_smoothing == 0 or self.loss_type == "sigmoid", "label_smoothing",
             f"applies to loss_type='sigmoid' only (loss_type is {self.loss_type!r}); set it to 0")
        need(self.max_prompt_length is None or (isinstance(self.max_prompt_length, int)
                                                and not isinstance(self.max_prompt_length, bool)
                                                and self.max_prompt_length > 0),
             "max_prompt_length", "must be None (no prompt limit of its own) or an integer > 0")
        self.beta, self.label_smoothing = float(self.beta), float(self.label_smoothing)
