"""Diffusion LLMs (LLaDA, Dream) served by vLLM: ``stepwise`` (the baseline a dLLM gets with no
speculative config), ``ssd`` and ``freedave``.

* Every method's output equals the engine-free reference decoder (``core.dllm.generate`` on
  the pure-PyTorch model of the same weights, same block length, steps, remasking and cache
  policy), so ``ssd`` / ``freedave`` equal ``stepwise`` token for token: greedy at batch 1 and
  batch 6 (mixed prompt lengths, ``max_tokens`` 1..40, EOS on and off, a last partial block),
  and at temperature > 0 with per-request seeds (the randomness is keyed by seed, step and
  position, so the draft-and-verify methods reproduce the baseline's samples).
* Model forwards per request (counted in the worker) never exceed the baseline's.
"""

import pytest

from e2e.conftest import make_llm, shutdown

pytestmark = pytest.mark.e2e

BLOCK, STEPS = 8, 8
COMMON = dict(max_model_len=256, max_num_batched_tokens=256, max_num_seqs=8)
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20 + i for i in range(17)], [3],
           [40, 41, 40, 41, 40, 41, 40, 41], [30, 31, 32, 33, 34]]
MAX_TOKENS = [20, 8, 40, 1, 13, 33]
METHODS = {  # name -> (speculative config, options)
    "stepwise": (None, {}),
    "ssd": ({"method": "ssd", "num_speculative_tokens": 3}, {"mix_order": True}),
    # budget: ssd runs the default (auto: drafted nodes per round chosen by the controller,
    # never more forwards than stepwise); freedave fixed (d every round: strictly fewer)
    "freedave": ({"method": "freedave", "num_speculative_tokens": 4},
                 {"remasking": "random", "budget": "fixed"}),
}
CASES = [("llada", m) for m in METHODS] + [("dream", m) for m in METHODS]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import build_tiny_dllm

    return {kind: build_tiny_dllm(tmp_path_factory.mktemp(kind), kind, seed=3)
            for kind in ("llada", "dream")}


@pytest.fixture(scope="module")
def engine(models):
    made = {}

    def get(kind, method):
        if (kind, method) not in made:
            for key in [k for k in made if k[0] != kind or k[1] != method]:
                shutdown(made.pop(key))  # one engine alive at a time (2-core machines)
            spec, opts = METHODS[method]
            name = spec["method"] if spec else "stepwise"
            made[(kind, method)] = make_llm(
                models[kind], speculative_config=spec,
                additional_config={"anyorder": {name: {"block_length": BLOCK,
                                                       "steps_per_block": STEPS, **opts}}},
                **COMMON)
        return made[(kind, method)]

    yield get
    for llm in made.values():
        shutdown(llm)


def _params(temperature=0.0, seeds=None):
    from vllm import SamplingParams

    # seeded even when greedy: `random` remasking draws from the seed at temperature 0 too
    return [SamplingParams(temperature=temperature, max_tokens=m, ignore_eos=(i % 2 == 0),
                           seed=100 + i if seeds is None else seeds[i])
            for i, m in enumerate(MAX_TOKENS)]


def _generate(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _reference(path, kind, prompts, params, remasking="low_confidence"):
    """Engine-free stepwise decoding of the same weights, one request at a time."""
    import torch

    from vllm_anyorder.core.dllm import generate
    from vllm_anyorder.core.dllm_blocks import DllmSettings
    from vllm_anyorder.model_executor.dream import DreamModel
    from vllm_anyorder.model_executor.llada import LLaDAModel

    model = (LLaDAModel if kind == "llada" else DreamModel).from_pretrained(path, torch.float32)
    out = []
    for p, sp in zip(prompts, params):
        s = DllmSettings(mask_id=model.mask_token_id, max_tokens=sp.max_tokens,
                         block_length=BLOCK, steps_per_block=STEPS, temperature=sp.temperature,
                         eos_id=None if sp.ignore_eos else 0, remasking=remasking)
        out.append(generate(model, [p], s, seeds=[sp.seed or 0])[0].tokens)
    return out


def _counters(llm):
    def read(worker):
        d = worker.model_runner.drafter
        return list(d.finished)

    return llm.collective_rpc(read)[0]


@pytest.fixture(scope="module")
def references(models):
    cache = {}

    def get(kind, temperature, remasking="low_confidence"):
        key = (kind, temperature, remasking)
        if key not in cache:
            params = _params(temperature, seeds=[11 * i + 1 for i in range(len(PROMPTS))]
                             if temperature else None)
            cache[key] = (params, _reference(models[kind], kind, PROMPTS, params, remasking))
        return cache[key]

    return get


FORWARDS: dict = {}
TRACES: dict = {}


@pytest.mark.parametrize("kind,method", CASES)
def test_outputs_equal_the_reference_decoder(engine, references, kind, method):
    llm = engine(kind, method)
    if method == "ssd":  # record the node logits (chains of several nodes per forward)
        llm.collective_rpc(lambda w: setattr(w.model_runner.drafter, "trace", []))
    remasking = METHODS[method][1].get("remasking", "low_confidence")
    params, want = references(kind, 0.0, remasking)
    assert _generate(llm, PROMPTS, params) == want  # batch 6
    assert _generate(llm, PROMPTS[:1], params[:1]) == want[:1]  # batch 1
    assert _generate(llm, PROMPTS[2:3], params[2:3]) == want[2:3]
    sampled_params, sampled_want = references(kind, 0.9, remasking)
    got = _generate(llm, PROMPTS, sampled_params)
    assert got == sampled_want
    assert got != want  # the seeds really changed the decisions
    if method == "ssd":
        TRACES[kind] = llm.collective_rpc(lambda w: w.model_runner.drafter.trace)[0]
        llm.collective_rpc(lambda w: setattr(w.model_runner.drafter, "trace", None))
    rows = _counters(llm)
    # no repair forwards, except for 1-token prompts: vLLM pads their prefill with
    # placeholder rows (spec-decode padding), so their KV is rewritten once
    assert rows and all(r["repairs"] <= (r["prompt_len"] == 1) for r in rows), \
        [(r["prompt_len"], r["max_tokens"], r["repairs"], r["steps"]) for r in rows]
    FORWARDS[(kind, method)] = {(r["prompt_len"], r["max_tokens"], r["temperature"]):
                                r["forwards"] for r in rows}


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_denoising_logits_equal_the_pytorch_reference(models, kind):
    """Every forward the proposer runs over vLLM's paged cache (node canvases of a window,
    block-causal over the cached prefix) gives the logits the plain PyTorch model computes
    for the same canvases under the same cache policy (``core.dllm_cache.BlockEvaluator``,
    full recompute of prompt + canvas with the block-causal mask)."""
    import torch

    from vllm_anyorder.core.dllm_blocks import DllmSettings, Plan
    from vllm_anyorder.core.dllm_cache import BlockEvaluator
    from vllm_anyorder.model_executor.dream import DreamModel
    from vllm_anyorder.model_executor.llada import LLaDAModel

    trace = TRACES.get(kind)
    if trace is None:
        pytest.skip("needs the ssd run of this module")
    model = (LLaDAModel if kind == "llada" else DreamModel).from_pretrained(models[kind],
                                                                           torch.float32)
    assert len(trace) > 20
    for t in trace[:40]:
        s = DllmSettings(mask_id=model.mask_token_id, max_tokens=t["nodes"].shape[1],
                         block_length=BLOCK, steps_per_block=STEPS)
        req = type("R", (), {"prompt": torch.tensor(t["prompt"])})()
        want = BlockEvaluator(model, s, "prefix")([(req, Plan(
            t["nodes"], t["window"]))])[0]
        assert want.shape == t["logits"].shape
        assert torch.allclose(t["logits"], want.float(), atol=2e-4, rtol=1e-4), \
            (t["window"], (t["logits"] - want).abs().max())


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_forwards_never_exceed_the_baseline(kind):
    base = FORWARDS.get((kind, "stepwise"))
    if base is None:
        pytest.skip("needs the stepwise run of this module")
    for method in ("ssd", "freedave"):
        mine = FORWARDS.get((kind, method))
        # requests still in the batch when the counters were read are missing: compare
        # the ones both runs finished (each (prompt, max_tokens, temperature) is unique)
        keys = mine.keys() & base.keys()
        assert len(keys) >= len(PROMPTS) + 4
        if METHODS[method][1].get("remasking", "low_confidence") != "low_confidence":
            # another remasking rule ends at another EOS: compare the ignore_eos requests
            # (even indices), whose baseline forward count is the whole schedule
            full = {(len(p), m) for p, m in list(zip(PROMPTS, MAX_TOKENS))[::2]}
            keys = {k for k in keys if k[:2] in full}
            assert len(keys) >= 5
        assert all(mine[k] <= base[k] for k in keys), (method, mine, base)
        if METHODS[method][1].get("budget") == "fixed":  # auto may decide drafts do not pay
            assert sum(mine[k] for k in keys) < sum(base[k] for k in keys), (method, mine, base)


def test_engine_settings_and_default_method(engine):
    llm = engine("dream", "stepwise")
    cfg = llm.llm_engine.vllm_config
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.scheduler_config.enable_chunked_prefill is False
    assert cfg.speculative_config.num_speculative_tokens == BLOCK - 1
    assert cfg.additional_config["anyorder"]["resolved"] == "stepwise"
