"""Bad configuration fails in the front-end process, before any engine process starts,
with a message that names the problem."""

import pytest

from e2e.conftest import make_llm

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("spec,extra,match", [
    ({"method": "jacobi", "num_speculative_tokens": 200}, None, "MAX_SPEC_LEN"),
    ({"method": "jacobi", "num_speculative_tokens": 8}, {"anyorder": {"jacobi": {"blocks": 2}}},
     "unknown option"),
    ({"method": "jacobi", "num_speculative_tokens": 8}, {"anyorder": {"jacobi": {"spawn_ratio": 1.5}}},
     "spawn_ratio"),
    ({"method": "jacobi", "num_speculative_tokens": 8}, {"anyorder": {"jacobbi": {}}},
     "unknown key"),
    ({"method": "custom_class", "model": "vllm_anyorder.proposers.jacobi.JacobiProposer",
      "num_speculative_tokens": 8}, {"anyorder": {"jacobi": {"num_blocks": 0}}}, "num_blocks"),
])
def test_bad_config_fails_at_start_up(tiny_llama, spec, extra, match):
    import multiprocessing

    before = len(multiprocessing.active_children())
    with pytest.raises(ValueError, match=match):
        make_llm(tiny_llama, speculative_config=spec, additional_config=extra)
    assert len(multiprocessing.active_children()) == before  # nothing half-started


def test_unknown_method_is_refused(tiny_llama):
    with pytest.raises(Exception, match="method"):
        make_llm(tiny_llama, speculative_config={"method": "jacobbi", "num_speculative_tokens": 4})
