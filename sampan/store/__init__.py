"""``sampan.store``: where things live on disk, below every other layer.

- ``sampan.utils.paths``: ``home()``, ``cache_dir()``, ``user_models_dir()``.
- ``sampan.store.models``: the model store (``resolve``, ``list_models``, ``model_file``,
  ``ModelCard``, ``ModelNotFoundError``).
- ``sampan.store.model_dir``: ``ModelDir``, the one reader of a model directory's layout
  (``task.json``, the base-model chain, files through it, the cache digest).

None imports anything above ``sampan.utils`` (``tests/test_layers.py``), so text, fine-tuning,
inference and Taskflow can all find models and caches without importing the hub's recipes.
"""
