"""``Output``: how a verb prints its result, the one ``--json`` switch every reporting verb takes."""

from __future__ import annotations

import dataclasses

from sampan.utils.flags import SWITCH


@dataclasses.dataclass
class Output:
    """How the result is printed.

    Fields:
        json: print JSON (for scripts) instead of a table.
    """

    json: bool = dataclasses.field(default=False, metadata={SWITCH: True})
