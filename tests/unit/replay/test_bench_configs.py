"""The benchmarks build each dLLM configuration one way (benchmarks/configs.dllm)."""

from benchmarks import configs
from benchmarks.bench_dllm import configs as dllm_table
from benchmarks.record_trace import method_config


def test_a_trace_records_the_configuration_bench_dllm_times():
    row = next(c for c in dllm_table(configs.DLLM_BLOCK, 0, [4], [4]) if c.name == "ssd N=4 fixed")
    spec, extra, model = method_config("ssd", 4, None)
    assert (spec, extra) == (row.speculative_config, row.additional_config)
    assert model == configs.LLADA and extra["anyorder"]["ssd"]["budget"] == "fixed"


def test_stepwise_has_no_speculative_config():
    cfg = configs.dllm("stepwise (baseline)", "stepwise")
    assert cfg.speculative_config is None and cfg.name == "stepwise (baseline)"
    assert cfg.additional_config["anyorder"]["stepwise"]["block_length"] == configs.DLLM_BLOCK
