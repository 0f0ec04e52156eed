"""Test configuration. `pythonpath` in pyproject.toml makes `helpers` and `tests.fakeapi` importable."""
