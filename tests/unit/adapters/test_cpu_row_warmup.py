"""The CPU row warm-up (``model_executor/cpu_row_warmup``): which layers it drives, at which
row counts, and where it stops (fake layers that record their calls; no vLLM, no timing)."""

from __future__ import annotations

import pytest
import torch

from vllm_anyorder.model_executor import cpu_row_warmup as warmup


class FakeLinear(torch.nn.Module):
    """A vLLM linear layer as the CPU platform leaves it: ``cpu_linear(x, weight, bias)``."""

    def __init__(self, k: int, n: int, bias: bool = False, calls: list | None = None,
                 fail_at: int | None = None) -> None:
        super().__init__()
        self.input_size_per_partition, self.output_size_per_partition = k, n
        self.params_dtype = torch.bfloat16
        self.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)  # packed away
        self.bias = torch.nn.Parameter(torch.zeros(n), requires_grad=False) if bias else None
        self.calls = calls if calls is not None else []
        self.fail_at = fail_at

    def cpu_linear(self, x, weight, bias):
        if self.fail_at is not None and x.shape[0] >= self.fail_at:
            raise RuntimeError("no kernel for this shape")
        self.calls.append((id(self), tuple(x.shape), x.dtype, bias is not None))
        return x.new_zeros(x.shape[0], self.output_size_per_partition)


class FakeEmbedding(torch.nn.Module):
    """A tied lm head: an embedding with its [vocab, hidden] weight kept and ``cpu_linear``."""

    def __init__(self, vocab: int, hidden: int, calls: list) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(vocab, hidden, dtype=torch.bfloat16),
                                         requires_grad=False)
        self.calls = calls

    def cpu_linear(self, x, weight, bias):
        self.calls.append((id(self), tuple(x.shape), x.dtype, bias is not None))
        return x @ weight.t()


def model_of(calls: list) -> torch.nn.Module:
    """Two decoder layers of the same shapes, a biased projection and a tied lm head."""
    m = torch.nn.Module()
    m.layers = torch.nn.ModuleList()
    for _ in range(2):
        layer = torch.nn.Module()
        layer.qkv = FakeLinear(8, 24, calls=calls)
        layer.o = FakeLinear(8, 8, calls=calls)
        layer.up = FakeLinear(8, 16, bias=True, calls=calls)
        m.layers.append(layer)
    m.plain = torch.nn.Linear(8, 8)  # no cpu_linear: not a CPU-dispatched layer
    m.lm_head = FakeEmbedding(32, 8, calls)
    return m


def test_every_distinct_shape_runs_once_at_every_row_count_in_order():
    calls: list = []
    done = warmup.warm_row_counts(model_of(calls), 5, budget=60.0)
    assert done == 5
    # one layer per (k, n, dtype, bias): qkv, o, up and the lm head; the second decoder
    # layer shares the first one's shapes, the torch Linear has no CPU dispatch
    assert len({c[0] for c in calls}) == 4
    rows = [c[1][0] for c in calls]
    assert rows == [r for r in range(1, 6) for _ in range(4)]
    assert all(c[1][1] == 8 and c[2] == torch.bfloat16 for c in calls)
    assert sorted(c[3] for c in calls[:4]) == [False, False, False, True]  # bias as in use


def test_room_in_the_kernel_cache_bounds_the_row_counts(monkeypatch):
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "40")
    calls: list = []
    assert warmup.kernel_room(4) == 5  # half of 40 kernels over 4 shapes
    assert warmup.warm_row_counts(model_of(calls), 100, budget=60.0) == 5
    assert max(c[1][0] for c in calls) == 5


def test_the_default_room_keeps_the_small_row_counts():
    # 1-507 rows of 5 shapes pushed the small counts out of oneDNN's 1024 kernels again
    assert warmup.kernel_room(5) * 5 <= warmup.KERNEL_CACHE // 2
    assert warmup.kernel_room(5) >= 64  # batch 4 with 15 drafts each fits


def test_the_time_budget_stops_it_after_the_row_count_that_spent_it():
    calls: list = []
    assert warmup.warm_row_counts(model_of(calls), 50, budget=1e-12) == 1
    assert {c[1][0] for c in calls} == {1}


def test_off_switch_and_non_cpu_models_do_nothing(monkeypatch):
    calls: list = []
    monkeypatch.setenv(warmup.BUDGET_ENV, "0")
    assert warmup.warm_row_counts(model_of(calls), 8) == 0
    monkeypatch.delenv(warmup.BUDGET_ENV)
    assert warmup.warm_row_counts(torch.nn.Linear(4, 4), 8) == 0  # no CPU-dispatched layer
    assert warmup.warm_row_counts(object(), 8) == 0
    assert calls == []


def test_the_budget_comes_from_the_environment_and_a_bad_value_is_ignored(monkeypatch):
    monkeypatch.setenv(warmup.BUDGET_ENV, "0.5")
    assert warmup.budget_seconds() == 0.5
    monkeypatch.setenv(warmup.BUDGET_ENV, "three")
    assert warmup.budget_seconds() == warmup.DEFAULT_BUDGET
    monkeypatch.delenv(warmup.BUDGET_ENV)
    assert warmup.budget_seconds() == warmup.DEFAULT_BUDGET


def test_a_layer_it_cannot_drive_stops_it_without_failing_the_load():
    calls: list = []
    m = torch.nn.Module()
    m.a = FakeLinear(4, 4, calls=calls)
    m.b = FakeLinear(4, 6, calls=calls, fail_at=3)
    assert warmup.warm_row_counts(m, 10, budget=60.0) == 2
    assert max(c[1][0] for c in calls) == 3  # the first layer ran row count 3, then it stopped


@pytest.mark.parametrize("seqs,drafts,tokens,expected", [
    (4, 15, 8192, 64), (256, 16, 8192, 4352), (256, 16, 2048, 2048),
    (1, 0, 16, 1)])
def test_verification_rows_is_every_request_with_its_full_chain_within_the_token_budget(
        seqs, drafts, tokens, expected):
    assert warmup.verification_rows(seqs, drafts, tokens) == expected


def test_the_proposer_warms_its_target_at_load(monkeypatch):
    from types import SimpleNamespace

    from vllm_anyorder.proposers import base

    seen = []
    monkeypatch.setattr(base, "warm_row_counts", lambda model, rows: seen.append((model, rows)))
    proposer = base.AnyOrderProposer.__new__(base.AnyOrderProposer)
    proposer.max_chain = 7
    proposer.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(
        max_num_seqs=4, max_num_batched_tokens=2048))
    target = torch.nn.Linear(2, 2)
    proposer.load_model(target)
    assert proposer.target is target and seen == [(target, 32)]
