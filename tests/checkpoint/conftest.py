"""Checkpoint tests save a directory per leaf unless they ask for the consolidated layout.

Most tests here damage, replace or inspect one leaf's files, which only the directory layout
has; a single-rank save of a small state would otherwise consolidate its arrays into one OCDBT
database (`array_store`). Tests of that layout take the `consolidated` fixture.
"""

from __future__ import annotations

import pytest

from functrain.checkpoint import array_store

CONSOLIDATE_BELOW = array_store.CONSOLIDATE_BELOW


@pytest.fixture(autouse=True)
def directory_per_leaf(monkeypatch):
    monkeypatch.setattr(array_store, "CONSOLIDATE_BELOW", 0)


@pytest.fixture
def consolidated(directory_per_leaf, monkeypatch):
    """Small single-rank saves consolidate their arrays, as they do outside the tests."""
    monkeypatch.setattr(array_store, "CONSOLIDATE_BELOW", CONSOLIDATE_BELOW)
