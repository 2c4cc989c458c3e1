"""What ``sampan hub list`` prints of a model card (the verbs themselves: ``sampan.commands.hub``
and ``sampan.commands.task``)."""

from __future__ import annotations

# The figures a table row has room for: the scores, not their losses, supports or precision /
# recall parts (``--json`` prints every figure of every card).
_HEADLINE_SUFFIXES = ("f1", "accuracy", "perplexity")


def headline_metrics(metrics: dict[str, object], sep: str = ", ", short: bool = False) -> str:
    """A card's scores for ``sampan hub list``: ``test_f1=0.924, test_PER_f1=0.911, ...``;
    ``short`` drops the split's prefix (``f1=0.924``: every card's scores are held-out figures)."""
    def name(key: str) -> str:
        return key.removeprefix("test_").removeprefix("heldout_") if short else key

    return sep.join(f"{name(k)}={v:.3g}" if isinstance(v, float) else f"{name(k)}={v}"
                    for k, v in metrics.items() if k.endswith(_HEADLINE_SUFFIXES))
