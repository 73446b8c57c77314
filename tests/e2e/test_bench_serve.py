"""``python -m benchmarks.bench_serve``: vLLM's own benchmark client (``vllm-anyorder bench
serve``) against a ``vllm-anyorder serve`` per method, on ``models/ar-target``.

One short run (2 servers, one after the other; 4 prompts of 16 tokens at concurrency 1, the
``custom`` JSONL of the benchmark prompts and vLLM's ``random`` dataset; the ``jacobi`` server
runs each point twice, its budget switched live between ``fixed`` and ``cycle:0`` by
``--modes``): every row holds vLLM's throughput and TPOT, every request completed with its 16
tokens, the drafting row carries vLLM's acceptance length (``fixed``: on a 64-token run
``auto`` may rightly choose not to draft at all, and vLLM then reports no acceptance) and the
drafts-off row none (the switch reached the worker), and the plot is written. No timing is
asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.server]
pytest.importorskip("httpx")
pytest.importorskip("pandas")  # vLLM's custom dataset reader (the bench extra)

REPO = Path(__file__).resolve().parents[2]
PROMPTS, TOKENS = 4, 16


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    sys.path.insert(0, str(REPO))
    from benchmarks import bench_serve

    out = tmp_path_factory.mktemp("serve") / "serve.json"
    bench_serve.main([
        "--model", str(REPO / "models" / "ar-target"), "--methods", "none",
        "--config", "jacobi", '{"method": "jacobi", "num_speculative_tokens": 8}',
        '{"anyorder": {"jacobi": {"num_blocks": 2, "budget": "fixed"}}}',
        "--concurrency", "1", "--num-prompts", str(PROMPTS), "--max-tokens", str(TOKENS),
        "--prompt-tokens", "32", "--dataset", "custom,random", "--warmups", "1",
        "--modes", "fixed;cycle:0",
        "--max-model-len", "256", "--timeout", "300", "--dtype", "float32", "--out", str(out)])
    return out, json.loads(out.read_text())


def test_every_method_and_dataset_has_vllm_throughput_and_tpot(report):
    _, data = report
    rows = {(r["method"], r["dataset"]): r for r in data["rows"]}
    assert set(rows) == {(m, d) for m in ("none", "jacobi@fixed", "jacobi@cycle:0")
                         for d in ("custom", "random")}
    for key, row in rows.items():
        assert row["completed"] == PROMPTS and not row["failed"], key
        assert row["total_output_tokens"] == PROMPTS * TOKENS, key  # --ignore-eos
        assert row["output_throughput"] > 0 and row["mean_tpot_ms"] > 0, key
        assert row["concurrency"] == 1 and row["raw"]["max_concurrency"] == 1, key
    assert data["methods"]["jacobi"]["speculative_config"]["num_speculative_tokens"] == 8
    for dataset in ("custom", "random"):
        assert rows[("jacobi@fixed", dataset)]["spec_decode_acceptance_length"] >= 1.0
        assert not rows[("jacobi@cycle:0", dataset)]["spec_decode_acceptance_length"]
        assert rows[("none", dataset)]["spec_decode_acceptance_length"] is None
        # greedy through vLLM's client: jacobi's texts are plain decoding's, token for token,
        # in either mode (float32: in bf16 a near-tie can flip with the batch's shape)
        for mode in ("jacobi@fixed", "jacobi@cycle:0"):
            assert rows[(mode, dataset)]["outputs_sha1"] == rows[("none", dataset)]["outputs_sha1"]
        assert 0.0 <= rows[("none", dataset)]["repetition_share"] <= 1.0


def test_the_plot_is_written(report):
    out, _ = report
    plot = out.with_name(out.stem + "-serve.png")
    assert plot.exists() and plot.stat().st_size > 10_000
