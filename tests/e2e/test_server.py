"""`vllm-anyorder serve` with each method (`jacobi`, `specdiff`): OpenAI completions and chat
endpoints, streaming and not, over real HTTP on loopback; greedy text equals plain greedy
decoding of the model."""

import json

import pytest
import requests

from e2e.conftest import serve

pytestmark = [pytest.mark.e2e, pytest.mark.server]


def _method_args(method: str, request) -> tuple[dict, dict]:
    if method == "jacobi":
        # budget fixed: the metrics test needs drafts whatever this (loaded) machine's
        # step costs say; the budget's own metrics are checked all the same
        return ({"method": "jacobi", "num_speculative_tokens": 8},
                {"anyorder": {"jacobi": {"num_blocks": 2, "budget": "fixed"}}})
    drafter = request.getfixturevalue("cyclic_drafter")
    return ({"method": "specdiff", "model": str(drafter), "num_speculative_tokens": 8},
            {"anyorder": {"specdiff": {"steps": 2, "budget": "fixed"}}})


@pytest.fixture(scope="module", params=["jacobi", "specdiff"])
def server(cyclic_llama, tmp_path_factory, request):
    spec, extra = _method_args(request.param, request)
    args = ["--speculative-config", json.dumps(spec), "--additional-config", json.dumps(extra),
            "--enforce-eager", "--dtype", "float32", "--max-model-len", "512",
            "--kv-cache-memory-bytes", str(1 << 28), "--served-model-name", "tiny"]
    with serve(cyclic_llama, args, tmp_path_factory.mktemp("server") / "server.log") as base:
        yield base


@pytest.fixture(scope="module")
def hf_greedy(cyclic_llama):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(cyclic_llama, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(cyclic_llama)

    def run(prompt: str, n: int) -> str:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None)
        return tok.decode(out[0, ids.shape[1]:])

    return run


def _sse(resp):
    for line in resp.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[6:])


def test_completions_greedy_equals_plain_decoding(server, hf_greedy):
    for prompt in ("abc", "hello kl"):
        r = requests.post(server + "/v1/completions", json={
            "model": "tiny", "prompt": prompt, "max_tokens": 60, "temperature": 0,
            "ignore_eos": True}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == hf_greedy(prompt, 60)


def test_completions_streaming_equals_non_streaming(server):
    body = {"model": "tiny", "prompt": "mnop", "max_tokens": 50, "temperature": 0, "ignore_eos": True}
    full = requests.post(server + "/v1/completions", json=body, timeout=120).json()
    with requests.post(server + "/v1/completions", json={**body, "stream": True}, stream=True,
                       timeout=120) as r:
        chunks = [c["choices"][0]["text"] for c in _sse(r)]
    assert len(chunks) > 1 and "".join(chunks) == full["choices"][0]["text"]


def test_chat_streaming(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "abc"}],
            "max_tokens": 40, "temperature": 0}
    full = requests.post(server + "/v1/chat/completions", json=body, timeout=120)
    assert full.status_code == 200, full.text
    text = full.json()["choices"][0]["message"]["content"]
    with requests.post(server + "/v1/chat/completions", json={**body, "stream": True},
                       stream=True, timeout=120) as r:
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in _sse(r))
    assert streamed == text and len(text) > 0


def test_spec_decode_metrics_and_bad_request(server):
    r = requests.post(server + "/v1/completions", json={
        "model": "tiny", "prompt": "abc", "max_tokens": -3}, timeout=30)
    assert r.status_code == 400
    metrics = requests.get(server + "/metrics", timeout=30).text
    accepted = [l for l in metrics.splitlines()
                if l.startswith("vllm:spec_decode_num_accepted_tokens_total")]
    assert accepted and float(accepted[0].split()[-1]) > 0
    assert "vllm:spec_decode_num_accepted_tokens_per_pos" in metrics
    # the speculation budget's own metrics (stat-logger plugin, vllm_anyorder/metrics.py)
    steps = [l for l in metrics.splitlines() if l.startswith("vllm:anyorder_budget_steps_total")]
    assert steps and float(steps[0].split()[-1]) > 0
    assert "vllm:anyorder_budget_steps_without_drafts_total" in metrics
    assert "vllm:anyorder_budget_cost_slope_seconds_per_row" in metrics
    assert requests.get(server + "/health", timeout=5).status_code == 200


def test_infill_request_on_a_left_to_right_model_is_refused(server):
    """Infill requests (``vllm_xargs.anyorder_infill``) need an AS-ARM: HTTP 400 here."""
    r = requests.post(server + "/v1/completions", json={
        "model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "ignore_eos": True,
        "vllm_xargs": {"anyorder_infill": [1, 3]}}, timeout=30)
    assert r.status_code == 400 and "AS-ARM" in r.text, r.text
    assert requests.get(server + "/health", timeout=5).status_code == 200
