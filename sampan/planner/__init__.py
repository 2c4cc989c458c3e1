"""``sampan plan``: choose dp / mp / pp / sharding / micro-batch / recompute for a model on a cluster.

    from sampan.planner import get_hardware, load_model, search, Workload
    result = search(load_model("gpt-175b"), 1024, Workload(seq_len=2048, global_batch=1536),
                    get_hardware("a100-80g"))   # or "qwen2.5-72b", "llama3-405b", a config.json
    best = result.plans[0]          # layout, memory (bytes / GPU), time (s / step), tokens/s, MFU

Memory (``memory.py``), time (``time.py``), the search (``search.py``) and the output
(``report.py``) are closed forms on paper: nothing is allocated or launched. docs/planner.md has
the formulas and how they compare with measured runs and published large-scale results.
"""

from sampan.planner.hardware import PRESETS, Hardware, get_hardware
from sampan.planner.layout import Layout, Workload, parse_fix
from sampan.planner.memory import Memory, memory
from sampan.planner.model_shape import ModelShape, load_model, parse_shape, shape_from_config
from sampan.planner.search import Plan, SearchResult, evaluate, layouts, search
from sampan.planner.time import StepTime, step_time

__all__ = ["PRESETS", "Hardware", "Layout", "Memory", "ModelShape", "Plan", "SearchResult", "StepTime", "Workload",
           "evaluate", "get_hardware", "layouts", "load_model", "memory", "parse_fix", "parse_shape", "search",
           "shape_from_config", "step_time"]
