"""config: typed options of the plugin methods (parse / section / store / load).

Pure Python: imports neither torch nor vLLM."""

import json

import pytest

from vllm_anyorder import config
from vllm_anyorder.config import AnyOrderConfigError, JacobiConfig


# --------------------------------------------------------------------------- parse
def test_defaults_are_the_papers_settings_with_the_budgets_best_block():
    cfg = config.parse("jacobi", None)
    assert cfg == JacobiConfig(block_size=16, num_blocks=2, pool_size=4, spawn_ratio=0.85,
                               recycle="pool_first")
    assert config.parse("jacobi", {}) == cfg


def test_options_and_derived_values_are_applied():
    cfg = config.parse("jacobi", {"num_blocks": 3, "pool_size": 0, "spawn_ratio": 1.0,
                                  "recycle": "off"}, block_size=16)
    assert (cfg.block_size, cfg.num_blocks, cfg.pool_size, cfg.spawn_ratio, cfg.recycle) == (
        16, 3, 0, 1.0, "off")


def test_unknown_option_is_rejected_with_the_valid_ones():
    with pytest.raises(AnyOrderConfigError) as err:
        config.parse("jacobi", {"blocks": 2, "num_blocks": 2})
    msg = str(err.value)
    assert "['blocks']" in msg and "jacobi" in msg
    for name in ("block_size", "num_blocks", "pool_size", "spawn_ratio", "recycle"):
        assert name in msg.split("valid options")[1]


@pytest.mark.parametrize("options,field", [
    ({"num_blocks": 0}, "num_blocks"),
    ({"num_blocks": 9}, "num_blocks"),
    ({"pool_size": -1}, "pool_size"),
    ({"pool_size": 65}, "pool_size"),
    ({"spawn_ratio": 0}, "spawn_ratio"),
    ({"spawn_ratio": 0.0}, "spawn_ratio"),
    ({"spawn_ratio": 1.5}, "spawn_ratio"),
    ({"spawn_ratio": float("nan")}, "spawn_ratio"),
    ({"recycle": "bogus"}, "recycle"),
    ({"step_drafts": -1}, "step_drafts"),
    ({"step_drafts": "8"}, "step_drafts"),
    ({"num_blocks": True}, "num_blocks"),  # bool is an int subclass: must still be refused
    ({"pool_size": False}, "pool_size"),
    ({"num_blocks": 2.0}, "num_blocks"),
    ({"num_blocks": "2"}, "num_blocks"),
])
def test_out_of_range_or_mistyped_options_are_rejected(options, field):
    with pytest.raises(AnyOrderConfigError, match=field):
        config.parse("jacobi", options)


@pytest.mark.parametrize("block_size", [0, 129, -1, True, 8.0])
def test_block_size_outside_1_to_128_is_rejected(block_size):
    with pytest.raises(AnyOrderConfigError, match="block_size"):
        config.parse("jacobi", {}, block_size=block_size)


@pytest.mark.parametrize("block_size", [1, 128])
def test_block_size_bounds_are_inclusive(block_size):
    assert config.parse("jacobi", {}, block_size=block_size).block_size == block_size


@pytest.mark.parametrize("value", ["0.5", True, None])
def test_mistyped_spawn_ratio_is_a_config_error(value):
    try:
        config.parse("jacobi", {"spawn_ratio": value})
    except AnyOrderConfigError:
        return
    raise AssertionError(f"spawn_ratio={value!r} was accepted")


def test_derived_option_set_by_the_user_is_rejected():
    with pytest.raises(AnyOrderConfigError, match=r"\['block_size'\].*num_speculative_tokens"):
        config.parse("jacobi", {"block_size": 8}, block_size=8)


def test_validation_errors_are_value_errors():
    # vLLM's start-up path and the e2e tests rely on ValueError semantics
    assert issubclass(AnyOrderConfigError, ValueError)


@pytest.mark.parametrize("n,k,expected", [(64, 2, 128), (8, 2, 16), (100, 2, 128),
                                          (128, 8, 128), (1, 1, 1), (16, 3, 48)])
def test_chain_length_is_n_times_k_capped_at_128(n, k, expected):
    assert JacobiConfig(block_size=n, num_blocks=k).chain_length == expected
    assert config.MAX_SPEC_LEN == 128


# --------------------------------------------------------------------------- section
def test_section_is_empty_when_absent_and_a_copy_when_present():
    assert config.section(None) == {}
    assert config.section({}) == {}
    assert config.section({"other": 1}) == {}
    ac = {"anyorder": {"jacobi": {"num_blocks": 3}}}
    sec = config.section(ac)
    assert sec == {"jacobi": {"num_blocks": 3}}
    sec["new"] = 1
    assert "new" not in ac["anyorder"]


@pytest.mark.parametrize("bad", ["jacobi", 3, ["jacobi"]])
def test_section_that_is_not_an_object_is_rejected(bad):
    with pytest.raises(AnyOrderConfigError, match="JSON object"):
        config.section({"anyorder": bad})


# --------------------------------------------------------------------------- store / load
def test_store_then_load_round_trips_through_json():
    ac = {"unrelated": {"keep": True}, "anyorder": {"other_key": 1}}
    cfg = JacobiConfig(block_size=8, num_blocks=3, pool_size=2, spawn_ratio=0.5, recycle="off")
    config.store(ac, "jacobi", cfg)
    assert ac["unrelated"] == {"keep": True}
    assert ac["anyorder"]["resolved"] == "jacobi"
    assert ac["anyorder"]["other_key"] == 1
    assert ac["anyorder"]["jacobi"]["block_size"] == 8
    # workers receive the dict serialised; the fallback must not override resolved values
    shipped = json.loads(json.dumps(ac))
    assert config.load(shipped, "jacobi", block_size=99) == cfg
    assert config.load(ac, "jacobi") == cfg


def test_load_revalidates_the_resolved_options():
    ac = {"anyorder": {"resolved": "jacobi", "jacobi": {"block_size": 8, "num_blocks": 0}}}
    with pytest.raises(AnyOrderConfigError, match="num_blocks"):
        config.load(ac, "jacobi")


def test_load_falls_back_to_parsing_when_not_resolved():
    # the front-end did not run the plugin: derived values come from the fallback
    assert config.load(None, "jacobi", block_size=16) == JacobiConfig(block_size=16)
    ac = {"anyorder": {"jacobi": {"num_blocks": 3}}}
    assert config.load(ac, "jacobi", block_size=16) == JacobiConfig(block_size=16, num_blocks=3)
    # options already in the section win over the fallback (no clash error)
    ac = {"anyorder": {"jacobi": {"block_size": 4}}}
    assert config.load(ac, "jacobi", block_size=16).block_size == 4
    # and still get validated
    with pytest.raises(AnyOrderConfigError, match="unknown option"):
        config.load({"anyorder": {"jacobi": {"bogus": 1}}}, "jacobi", block_size=16)
    # "resolved" naming another method does not count as resolved for this one
    ac = {"anyorder": {"resolved": "other", "jacobi": {"num_blocks": 4}}}
    assert config.load(ac, "jacobi", block_size=2) == JacobiConfig(block_size=2, num_blocks=4)


@pytest.mark.parametrize("bad", [[], "", 0, False])
def test_non_object_section_is_refused(bad):
    with pytest.raises(AnyOrderConfigError, match="JSON object"):
        config.section({"anyorder": bad})


def test_load_of_a_resolved_section_checks_keys():
    with pytest.raises(AnyOrderConfigError, match="unknown option"):
        config.load({"anyorder": {"resolved": "jacobi", "jacobi": {"block_size": 8, "bogus": 1}}}, "jacobi")
