"""Shared test set-up: tests/ on sys.path (tiny_models, reference) and tiny checkpoints."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """Peaked random fp32 Llama (vocab 64, char tokenizer): large argmax margins, so greedy
    comparisons are not at the mercy of kernel rounding."""
    from tiny_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), init_range=0.3, seed=1)


@pytest.fixture(scope="session")
def cyclic_llama(tmp_path_factory):
    """Tiny Llama whose greedy continuation loops over a fixed text (drafts get accepted)."""
    from tiny_models import build_cyclic_llama

    return build_cyclic_llama(tmp_path_factory.mktemp("cyclic_llama"))


CYCLE = "abcdefghij klmnop\n"


@pytest.fixture(scope="session")
def cyclic_drafter(tmp_path_factory):
    """Tiny MDLM drafter trained on the cyclic llama's text: its drafts are mostly accepted."""
    from tiny_models import build_tiny_drafter, char_vocab

    vocab = {t: i for i, t in enumerate(char_vocab(64))}
    text = [vocab[c] for c in CYCLE * 6]
    sequences = [text[s: s + 48] for s in range(len(CYCLE))]
    return build_tiny_drafter(tmp_path_factory.mktemp("cyclic_drafter"), sequences, vocab_size=64)


@pytest.fixture(scope="session")
def random_drafter(tmp_path_factory):
    """Random tiny MDLM drafter over the 64-token char vocabulary (drafts mostly rejected)."""
    from tiny_models import build_tiny_drafter

    return build_tiny_drafter(tmp_path_factory.mktemp("random_drafter"), None, vocab_size=64)
