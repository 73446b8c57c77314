"""`vllm-anyorder serve` on a diffusion LLM with no speculative config (the `stepwise` baseline). Completions (token-id prompts, compared with the engine-free reference decoder),
chat with the model's chat template, streaming that delivers the text as blocks commit, an
aborted stream, and bad input that gets an HTTP error while the server keeps serving."""

import json

import pytest
import requests

from e2e.test_dllm_decoding import BLOCK, STEPS
from e2e.conftest import serve

pytestmark = [pytest.mark.e2e, pytest.mark.server]


# `ssd` / `freedave` behind the server: tests/e2e/test_load.py (against this stepwise server)
@pytest.fixture(scope="module", params=["stepwise"])
def dllm_server(tmp_path_factory, request):
    from tiny_models import build_tiny_dllm

    path = build_tiny_dllm(tmp_path_factory.mktemp("dream"), "dream", seed=2)
    method = request.param
    extra = {"anyorder": {method: {"block_length": BLOCK, "steps_per_block": STEPS}}}
    args = ["--additional-config", json.dumps(extra), "--enforce-eager", "--dtype", "float32",
            "--max-model-len", "256", "--max-num-batched-tokens", "256",
            "--kv-cache-memory-bytes", str(1 << 26), "--served-model-name", "tiny"]
    if method == "ssd":
        args += ["--speculative-config", json.dumps({"method": "ssd", "num_speculative_tokens": 3})]
    with serve(path, args, tmp_path_factory.mktemp("server") / "server.log") as base:
        yield base, path


def _reference(path, prompt, max_tokens, seed=0, temperature=0.0):
    import torch

    from vllm_anyorder.core.dllm import generate
    from vllm_anyorder.core.dllm_blocks import DllmSettings
    from vllm_anyorder.model_executor.dream import DreamModel

    model = DreamModel.from_pretrained(path, torch.float32)
    s = DllmSettings(mask_id=model.mask_token_id, max_tokens=max_tokens, block_length=BLOCK,
                     steps_per_block=STEPS, temperature=temperature, eos_id=0)
    return generate(model, [prompt], s, seeds=[seed])[0].tokens


def test_completion_equals_the_reference(dllm_server):
    base, path = dllm_server
    prompt = [5, 6, 7, 8, 9, 10, 11]
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 21, "temperature": 0,
            "return_token_ids": True}
    r = requests.post(base + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == _reference(path, prompt, 21)
    body.update(temperature=0.8, seed=7)
    r = requests.post(base + "/v1/completions", json=body, timeout=120)
    assert r.json()["choices"][0]["token_ids"] == _reference(path, prompt, 21, 7, 0.8)


def test_streaming_delivers_whole_blocks(dllm_server):
    base, path = dllm_server
    prompt = [12, 13, 14]
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "stream": True, "return_token_ids": True}
    chunks = []
    with requests.post(base + "/v1/completions", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                ids = json.loads(line[6:])["choices"][0].get("token_ids") or []
                if ids:
                    chunks.append(ids)
    want = _reference(path, prompt, 24)
    assert sum(chunks, []) == want
    # the first token arrives with the prefill, then one block per engine step
    assert len(chunks[0]) == 1 and all(len(c) <= BLOCK for c in chunks)
    assert len(chunks) <= 2 + -(-len(want) // BLOCK)


def test_chat_and_an_aborted_stream(dllm_server):
    base, _ = dllm_server
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi there"}],
            "max_tokens": 16, "temperature": 0, "stream": True}
    with requests.post(base + "/v1/chat/completions", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # read one event, then drop the connection mid-stream
    body.pop("stream")
    r = requests.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None


def test_bad_input_gets_an_http_error(dllm_server):
    base, _ = dllm_server
    bad = [{"prompt": [5] * 300, "max_tokens": 4},  # longer than max_model_len
           {"prompt": [5, 6], "max_tokens": -3}]
    for extra in bad:
        r = requests.post(base + "/v1/completions", json={"model": "tiny", **extra}, timeout=60)
        assert 400 <= r.status_code < 500, r.text
    r = requests.post(base + "/v1/completions", timeout=60,
                      json={"model": "tiny", "prompt": [5, 6], "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200
