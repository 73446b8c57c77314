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
    # the guard on the lossless promise (on CPU vLLM itself would only fail in the worker)
    ({"method": "jacobi", "num_speculative_tokens": 4, "rejection_sample_method": "synthetic",
      "synthetic_acceptance_length": 2.0}, None, "rejection_sample_method='synthetic'"),
])
def test_bad_config_fails_at_start_up(tiny_llama, spec, extra, match):
    import multiprocessing

    before = len(multiprocessing.active_children())
    with pytest.raises(ValueError, match=match):
        make_llm(tiny_llama, speculative_config=spec, additional_config=extra)
    assert len(multiprocessing.active_children()) == before  # nothing half-started


@pytest.mark.parametrize("model,extra,match", [
    ("/nonexistent/drafter", None, "drafter"),
    ("DRAFTER", {"anyorder": {"specdiff": {"steps": 9}}}, "steps"),  # T > gamma
    ("DRAFTER", {"anyorder": {"specdiff": {"context_window": 60}}}, "trained length"),
    ("V16", None, "tokenizer"),  # a drafter of another vocabulary
])
def test_bad_specdiff_drafter_fails_at_start_up(tiny_llama, random_drafter, tmp_path, model,
                                                extra, match):
    import multiprocessing

    from tiny_models import build_tiny_drafter

    if model == "DRAFTER":
        model = str(random_drafter)
    elif model == "V16":
        model = str(build_tiny_drafter(tmp_path / "v16", None, vocab_size=16))
    before = len(multiprocessing.active_children())
    with pytest.raises(ValueError, match=match):
        make_llm(tiny_llama, speculative_config={"method": "specdiff", "model": model,
                                                 "num_speculative_tokens": 8},
                 additional_config=extra)
    assert len(multiprocessing.active_children()) == before


@pytest.mark.parametrize("flags,spec,match", [
    ({"spec_method": "jacobi", "spec_tokens": 200}, None, "MAX_SPEC_LEN"),
    ({"spec_method": "jacobi"}, {"method": "ngram"}, "mutually exclusive"),
    ({"spec_tokens": 8}, {"method": "jacobi", "rejection_sample_method": "block"},
     "rejection_sample_method='block'"),
])
def test_shorthand_flags_are_checked_like_the_dict(tiny_llama, flags, spec, match):
    """vLLM's --spec-method / --spec-tokens (``LLM`` keyword arguments) go through the same
    start-up checks (their resolved config equals the dict's: tests/plugin)."""
    with pytest.raises(ValueError, match=match):
        make_llm(tiny_llama, speculative_config=spec, **flags)


def test_unknown_method_is_refused(tiny_llama):
    with pytest.raises(Exception, match="method"):
        make_llm(tiny_llama, speculative_config={"method": "jacobbi", "num_speculative_tokens": 4})


def test_plain_custom_class_route_works(cyclic_llama):
    """vLLM's own hook, without the plugin's method name, runs the same proposer."""
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from e2e.conftest import shutdown

    spec = {"method": "custom_class", "model": "vllm_anyorder.proposers.jacobi.JacobiProposer",
            "num_speculative_tokens": 8}
    prompt = [5, 6, 7, 8]
    llm = make_llm(cyclic_llama, speculative_config=spec)
    try:
        assert llm.llm_engine.vllm_config.speculative_config.num_speculative_tokens == 16  # n*K
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                           SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0].token_ids
    finally:
        shutdown(llm)
    model = AutoModelForCausalLM.from_pretrained(cyclic_llama, dtype=torch.float32).eval()
    want = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                          eos_token_id=None)[0, len(prompt):].tolist()
    assert list(out) == want
