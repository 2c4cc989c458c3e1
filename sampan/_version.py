"""The package version, in one place: ``sampan.__version__``, ``pyproject.toml`` (read by setuptools)
and what modules inside the package record (export manifests, the server's ``/healthz``)."""

__version__ = "0.1.0"
