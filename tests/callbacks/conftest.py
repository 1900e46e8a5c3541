"""The shared observer fixtures (tests/observer_fixtures.py)."""

from observer_fixtures import *  # noqa: F403 (fixtures register by name)
