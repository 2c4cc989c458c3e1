"""The model zoo's shapes, readable without importing torch.

``sampan plan --model gpt-175b`` must answer in seconds, and importing ``sampan.models`` (and so
torch) costs 7-13 s on a loaded machine. These are the shapes ``sampan.models.get_config`` gives
for each registered name, as the planner reads them (``model_shape._from_config``);
``tests/test_planner_cold_start.py`` checks every entry against the registry, so a changed zoo
config fails the tests instead of planning a stale shape. A name that is registered but not
listed here still works: ``load_model`` falls back to the registry (and pays for torch).
"""

from __future__ import annotations

from sampan.planner.model_shape import ModelShape

ZOO: dict[str, ModelShape] = {shape.name: shape for shape in (
    # ERNIE (BERT-Chinese vocabulary): extra_params = pooler, MLM transform + bias, token types.
    ModelShape("ernie-tiny", 4, 256, 4, 21128, 1024, 512, True, 87944, "ernie"),
    ModelShape("ernie-base", 12, 768, 12, 21128, 3072, 512, True, 614792, "ernie"),
    ModelShape("ernie-large", 24, 1024, 16, 21128, 4096, 512, True, 1074824, "ernie"),
    # GPT-2 / GPT-3 shapes (sampan/models/registry.py).
    ModelShape("gpt-tiny", 4, 128, 4, 8192, 512, 256, True, 0, "gpt"),
    ModelShape("gpt-small", 12, 768, 12, 50257, 3072, 1024, True, 0, "gpt"),
    ModelShape("gpt-medium", 24, 1024, 16, 50257, 4096, 1024, True, 0, "gpt"),
    ModelShape("gpt-1.3b", 24, 2048, 16, 50257, 8192, 2048, True, 0, "gpt"),
    ModelShape("gpt-13b", 40, 5120, 40, 50257, 20480, 2048, True, 0, "gpt"),
    ModelShape("gpt-100b", 80, 10240, 80, 50257, 40960, 2048, True, 0, "gpt"),
    ModelShape("gpt-175b", 96, 12288, 96, 50257, 49152, 2048, True, 0, "gpt"),
)}
