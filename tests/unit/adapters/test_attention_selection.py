"""``VLLM_ANYORDER_ATTENTION`` (attention_backends/selection.py) and the torch backend's
vLLM side (torch_backend.py): which implementation each plugin model gets on CPU and off it,
the start-up refusals, eager mode off CPU, and the metadata builder / impl against
``paged_torch`` (row groups from vLLM's CommonAttentionMetadata, -1 slots, profiling)."""

from types import SimpleNamespace as NS

import pytest
import torch

pytest.importorskip("vllm")

from vllm_anyorder.attention_backends import selection  # noqa: E402
from vllm_anyorder.attention_backends.paged_torch import RowGroup  # noqa: E402


@pytest.mark.parametrize("value, on_cpu, want", [
    ("auto", True, selection.AUTO_ON_CPU),
    ("auto", False, {"asarm": "torch", "xlnet": "torch", "dllm": "torch"}),
    ("torch", True, {"asarm": "torch", "xlnet": "torch", "dllm": "torch"}),
    ("cpu_op", True, {"asarm": "cpu_op", "xlnet": "torch", "dllm": "cpu_op"}),
    ("", True, selection.AUTO_ON_CPU),
])
def test_the_implementation_each_model_gets(monkeypatch, value, on_cpu, want):
    monkeypatch.setenv(selection.ENV, value)
    assert {k: selection.implementation(k, on_cpu) for k in want} == want


def test_bad_choices_are_refused(monkeypatch):
    monkeypatch.setenv(selection.ENV, "flash")
    with pytest.raises(ValueError, match="expected one of auto, torch, cpu_op"):
        selection.implementation("dllm", True)
    monkeypatch.setenv(selection.ENV, "cpu_op")
    with pytest.raises(ValueError, match="CPU platform only"):
        selection.implementation("asarm", on_cpu=False)


@pytest.mark.parametrize("on_cpu", [True, False])
def test_engine_config_checks_the_choice_and_runs_eager_off_cpu(monkeypatch, on_cpu):
    from vllm_anyorder.model_executor.engine_configs import plugin_attention_settings

    monkeypatch.setenv(selection.ENV, "auto")
    cfg = NS(model_config=NS(enforce_eager=False))
    plugin_attention_settings(cfg, "m", "dllm", on_cpu=on_cpu)
    assert cfg.model_config.enforce_eager is (not on_cpu)  # no CUDA graphs for row groups
    monkeypatch.setenv(selection.ENV, "cpu_op")
    if not on_cpu:
        with pytest.raises(ValueError, match="CPU platform only"):
            plugin_attention_settings(cfg, "m", "dllm", on_cpu=False)


def test_backend_classes_and_registration(monkeypatch):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_anyorder.attention_backends import torch_backend

    monkeypatch.setenv(selection.ENV, "torch")
    for kind in ("asarm", "xlnet", "dllm"):
        cls = selection.backend_for(kind, f"test-{kind}")
        assert issubclass(cls, torch_backend.TorchPagedBackend)
        assert cls.get_name() == torch_backend.NAME
    assert torch_backend.NAME in AttentionBackendEnum.__members__  # vLLM's Attention looks it up
    torch_backend.register()  # idempotent
    monkeypatch.setenv(selection.ENV, "cpu_op")
    assert selection.backend_for("dllm", "test").get_name() == "CPU_ATTN"


def test_impl_refuses_what_it_cannot_do():
    from vllm_anyorder.attention_backends.torch_backend import TorchPagedImpl

    TorchPagedImpl(4, 8, 0.3, 2)
    for kw in (dict(alibi_slopes=[1.0] * 4), dict(sliding_window=16),
               dict(logits_soft_cap=30.0), dict(kv_cache_dtype="fp8"),
               dict(attn_type="encoder_only")):
        with pytest.raises(NotImplementedError, match="does not support"):
            TorchPagedImpl(4, 8, 0.3, 2, **kw)


def _common(qsl, seq_lens, causal, table, slots):
    from vllm_anyorder import _compat

    qsl = torch.tensor(qsl, dtype=torch.int32)
    return _compat.common_attention_metadata_cls()(
        query_start_loc=qsl, query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=len(seq_lens),
        num_actual_tokens=int(qsl[-1]), max_query_len=int((qsl[1:] - qsl[:-1]).max()),
        max_seq_len=max(seq_lens), block_table_tensor=table, slot_mapping=slots, causal=causal)


def test_builder_groups_and_impl_write_then_attend():
    """vLLM's per-request causal flags become row groups; the impl writes the rows' K/V
    (skipping -1) and attends exactly like paged_attention over those groups."""
    from vllm_anyorder.attention_backends.paged_torch import cache_shape, paged_attention
    from vllm_anyorder.attention_backends.torch_backend import (
        TorchPagedImpl, TorchPagedMetadataBuilder, row_groups,
    )

    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    slots = torch.tensor([12, 13, 14, 4, 5, -1])
    cm = _common([0, 3, 6], [3, 6], torch.tensor([0, 1], dtype=torch.int32), table, slots)
    assert row_groups(cm) == [RowGroup(0, 0, 3, 3, causal=False), RowGroup(1, 3, 3, 6)]
    assert [g.causal for g in row_groups(cm.replace(causal=True))] == [True, True]

    builder = TorchPagedMetadataBuilder.__new__(TorchPagedMetadataBuilder)  # no vLLM config
    md = builder.build(0, cm)
    assert md.groups == row_groups(cm) and md.num_actual_tokens == 6
    impl = TorchPagedImpl(4, 8, 8 ** -0.5, 2)
    cache = torch.zeros(cache_shape(4, 4, 2, 8))
    cache[0, :, :3] = torch.randn(2, 3, 16)  # request 1's first 3 tokens, written earlier
    q, k, v = torch.randn(6, 4, 8), torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    impl.do_kv_cache_update(None, k, v, cache, slots)
    assert torch.equal(cache[3, :, 0, :8], k[0]) and torch.equal(cache[1, :, 1, 8:], v[4])
    out = torch.full((6, 4, 8), float("nan"))
    assert impl.forward(None, q, k, v, cache, None, out) is out  # profiling: untouched
    impl.forward(None, q, k, v, cache, md, out)
    assert torch.equal(out, paged_attention(q, cache, table, md.groups, 8 ** -0.5))
