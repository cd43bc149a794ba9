"""Simulated times, whole timelines and results of a corpus of programs, pinned bit for
bit (`pinned_corpus.py`; the expected values in `pinned_corpus.json` were computed on
main before issue 14's speed work). A speed-up that moves one simulated nanosecond or
one result bit fails here."""
from __future__ import annotations

import json

import pytest

from .pinned_corpus import CORPUS, PINNED, comparable, fingerprint_one

EXPECTED = json.loads(PINNED.read_text())


def test_the_corpus_is_pinned_whole():
    assert sorted(EXPECTED) == sorted(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_simulated_timeline_and_results_unchanged(jax, name):
    got = fingerprint_one(jax, name)
    assert comparable(got) == comparable(EXPECTED[name])
