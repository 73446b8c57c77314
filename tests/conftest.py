"""Shared test set-up: tests/ on sys.path (tiny_models, reference) and tiny checkpoints."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _bind_worker_to_its_cores() -> None:
    """Under pytest-xdist (``scripts/test.sh``: two workers, at most one per core), each
    worker's engines run their OpenMP threads on that worker's own share of the cores.
    vLLM's automatic binding puts every single-rank engine on the same core (it keeps the
    other for the front end), so two workers' engines shared one core and two workers saved
    6% of the suite; with a core each, two e2e modules ran side by side in 238 s against
    323 s in turn (2-core EPYC). The worker's own torch work (the unit tiers) runs as many
    threads as its share has cores: two workers of two threads each on two cores took 280 s
    for ``tests/unit/core`` against 135 s in one process. Tests that start several ranks are
    marked ``serial`` and run alone, unbound."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    if not worker.startswith("gw"):
        return
    cores = worker_cores(int(worker[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
                         sorted(os.sched_getaffinity(0)))
    os.environ.setdefault("OMP_NUM_THREADS", str(len(cores.split(","))))
    if "torch" in sys.modules:  # imported before this file (a plugin): too late for the env
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cores)  # a setting of the user's stands


def worker_cores(index: int, workers: int, cores: list[int]) -> str:
    """Worker ``index``'s share of ``cores`` (``workers`` equal contiguous slices, at least one
    core each) as vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` reads a CPU list ("0", "4,5,6,7")."""
    share = max(1, len(cores) // max(1, workers))
    start = (index * share) % len(cores)
    return ",".join(str(c) for c in cores[start: start + share])


_bind_worker_to_its_cores()


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


# The longest modules, started first so the workers finish together (run last, ``test_load``
# ran alone for its last 7 minutes while the other worker sat idle; the order saved ~0.5 of
# 29 minutes). Modules keep their own order within (module-scoped engines). Seconds: setup +
# calls on one of two xdist workers, 2-core EPYC, 2026-12-07.
SLOW_FIRST = ("test_load.py",  # 490 s: 8 servers
              "test_bench_serve.py",  # 233 s
              "test_budget_switching.py", "test_dllm_decoding.py", "test_assd_greedy.py",
              "test_server.py", "test_specdiff_greedy.py", "test_jacobi_greedy.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable
