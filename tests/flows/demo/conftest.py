"""The demo's SFT tests train the same tiny model the trainer tests use."""
from tests.trainer.conftest import tiny_model  # noqa: F401  (a fixture, found by name)
