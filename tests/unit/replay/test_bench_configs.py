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


def test_bench_switch_runs_the_dllm_methods_against_stepwise_on_the_dllm_target():
    from benchmarks.bench_switch import DLLM_NODES, _row, _target

    for method in configs.DLLM_DRAFTING:
        row = _row(method)
        assert _target(method) == configs.LLADA
        assert row.speculative_config == {"method": method,
                                          "num_speculative_tokens": DLLM_NODES}
        assert row.additional_config["anyorder"][method]["budget"] == "auto"
    assert _row("assd").speculative_config == {"method": "assd"}


def test_the_controller_overhead_simulation_runs_closed_batches_through():
    from benchmarks.bench_step_overhead import controller_us

    # 64 steps of 8-token requests: several batches start and finish (a request that
    # finished must leave, or remaining() would hand the controller a zero)
    assert controller_us(4, 0.7, steps=64, closed=8) > 0
    assert controller_us(4, 0.0, steps=64) > 0
