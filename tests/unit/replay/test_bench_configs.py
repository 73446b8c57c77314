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


def test_bench_switch_interleaves_the_modes_by_closed_batch():
    """``--interleave``: every batch of the pass runs once per mode, the mode switched before
    it; a mode's time, outputs (in prompt order) and budget counters are its batches' sums."""
    import benchmarks.bench_switch as bs
    from types import SimpleNamespace

    calls: list[tuple[str, list[str]]] = []

    class Engine:
        def __init__(self, spec: bool):
            self.spec, self.mode = spec, "auto"
            self.totals = dict(steps=0, steps_without_drafts=0, drafted=0, accepted=0, probes=0)

        def collective_rpc(self, fn):  # the two calls bench_switch makes on a worker
            if getattr(fn, "func", None) is bs._set_mode:
                self.mode = fn.keywords["mode"]
                return [self.mode]
            assert fn is bs._totals
            return [dict(self.totals)]

        def generate(self, chunk, params, use_tqdm=False):
            calls.append((self.mode if self.spec else bs.NO_SPEC, list(chunk)))
            self.totals["steps"] += 10
            self.totals["drafted"] += 4 if self.mode == "cycle:4" else 0
            self.totals["propose_seconds"] = self.totals.get("propose_seconds", 0.0) + 0.002
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[len(p)])]) for p in chunk]

    out = bs._interleaved_round({False: Engine(False), True: Engine(True)},
                                [bs.NO_SPEC, "auto", "cycle:4"], ["a", "bb", "ccc"], None, 2, 1)
    # two batches (2 prompts, then 1), each run by every mode, rotated by batch and round
    assert [m for m, _ in calls] == ["auto", "cycle:4", bs.NO_SPEC, "cycle:4", bs.NO_SPEC, "auto"]
    assert {tuple(c) for _, c in calls} == {("a", "bb"), ("ccc",)}
    for mode in (bs.NO_SPEC, "auto", "cycle:4"):
        assert out[mode]["outputs"] == [[1], [2], [3]] and out[mode]["seconds"] >= 0
    assert out["cycle:4"]["budget"]["steps"] == 20
    assert out["cycle:4"]["budget"]["drafts_per_step"] == 8 / 20
    assert out["auto"]["budget"]["drafts_per_step"] == 0 and "budget" not in out[bs.NO_SPEC]
    assert abs(out["cycle:4"]["budget"]["propose_us"] - 1e6 * 0.004 / 20) < 1e-6  # per step
