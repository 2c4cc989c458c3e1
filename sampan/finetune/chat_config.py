"""``ChatConfig``: the chat-specific settings of ``sampan finetune --task chat`` (and DPO's rendering).

``FinetuneConfig`` nests it (``--chat.packing false``, ``--max-bad 50``); the base model, the
method and the Trainer's side are the fine-tune's own fields.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ChatConfig:
    """How conversations become training rows. Their length limit is ``FinetuneConfig.max_length``
    (one setting for every task): the longest encoded conversation, and the length of a packed row.
    A longer conversation is cut after its last assistant turn that fits (later turns dropped).

    Fields:
        packing: pack several conversations into each row of ``max_length`` tokens (attention
            stays inside each conversation and positions restart at 0 for each), so no compute
            goes to padding. Off: one conversation per row, padded to the longest in its batch.
        max_bad: how many bad records (broken JSON, wrong types, an unknown role, an empty
            conversation or one with no assistant turn, a turn over ``FinetuneConfig.max_length``,
            a conversation the template refuses) a run skips and reports with their line numbers;
            one more stops the run with an error listing them. 0: any bad record stops the run.
        system_prompt: a system message put first in every conversation that has none; None
            leaves such conversations to the template (many add their own default).
        chat_template: a Jinja chat template (its text, or the path of a ``.jinja`` file) that
            replaces the tokenizer's; needed for a base model whose tokenizer has none. None: the
            tokenizer's own (``tokenizer_config.json`` / ``chat_template.jinja``).
    """

    packing: bool = True
    max_bad: int = 100
    system_prompt: str | None = None
    chat_template: str | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, field: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"ChatConfig.{field} {rule}, got {getattr(self, field)!r}")

        def integer(value: object) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        need(isinstance(self.packing, bool), "packing", "must be true or false")
        need(integer(self.max_bad) and self.max_bad >= 0, "max_bad", "must be an integer >= 0 (0: stop at the first)")
        need(self.system_prompt is None or isinstance(self.system_prompt, str), "system_prompt",
             "must be None or a string")
        need(self.chat_template is None or (isinstance(self.chat_template, str) and self.chat_template.strip() != ""),
             "chat_template", "must be None (the tokenizer's) or a Jinja template / .jinja path")
