"""``sampan.store``: where things live on disk, below every other layer.

- ``sampan.utils.paths``: ``home()``, ``cache_dir()``, ``user_models_dir()``.
- ``sampan.store.models``: the model store (``resolve``, ``list_models``, ``model_file``,
  ``ModelCard``, ``ModelNotFoundError``).

Neither imports anything above ``sampan.utils`` (``tests/test_layers.py``), so text, fine-tuning,
inference and Taskflow can all find models and caches without importing the hub's recipes.
"""
