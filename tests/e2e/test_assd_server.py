"""`vllm-anyorder serve` with `assd` on an AS-ARM checkpoint: the OpenAI completions endpoint
(streaming and not) returns the AS-ARM's greedy continuation (pure-PyTorch reference)."""

import json

import pytest
import requests

from e2e.conftest import serve

pytestmark = [pytest.mark.e2e, pytest.mark.server]

PROMPT, N = "def f(x): return x", 24


@pytest.fixture(scope="module")
def asarm(tmp_path_factory):
    from asarm_models import build_tiny_asarm

    return build_tiny_asarm(tmp_path_factory.mktemp("asarm_server"), vocab_size=64)


@pytest.fixture(scope="module")
def server(asarm, tmp_path_factory):
    args = ["--speculative-config", json.dumps({"method": "assd", "num_speculative_tokens": 4}),
            "--additional-config", json.dumps({"anyorder": {"assd": {"drafter": "self"}}}),
            "--enforce-eager", "--dtype", "float32", "--max-model-len", "512",
            "--kv-cache-memory-bytes", str(1 << 28), "--served-model-name", "tiny"]
    with serve(asarm, args, tmp_path_factory.mktemp("assd_server") / "server.log") as base:
        yield base


@pytest.fixture(scope="module")
def reference_text(asarm):
    from transformers import AutoTokenizer

    from asarm_models import Conditionals

    tok = AutoTokenizer.from_pretrained(asarm)
    cond, ids, gen = Conditionals(asarm), tok(PROMPT)["input_ids"], []
    for _ in range(N):
        gen.append(int(cond.logits(ids, gen)[0].argmax()))
    return tok.decode(gen)


def test_completion_is_the_greedy_continuation(server, reference_text):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": N, "temperature": 0.0,
            "ignore_eos": True}
    out = requests.post(server + "/v1/completions", json=body, timeout=120).json()
    assert out["choices"][0]["text"] == reference_text
    chunks = []
    with requests.post(server + "/v1/completions", json={**body, "stream": True},
                       stream=True, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunks.append(json.loads(line[6:])["choices"][0]["text"])
    assert "".join(chunks) == reference_text


INFILL_SEQ = [None, 20, 21, None, None, 30, 31, 32] + [None] * 7 + [40]


def test_infill_request_and_a_malformed_one(server, asarm):
    """An infill request (token-id prompt + ``vllm_xargs``) returns the masks filled as the
    reference AS-ARM's sequential infilling fills them; a malformed one gets HTTP 400 with
    the reason, and the server keeps serving."""
    from reference.assd_reference import sequential_infill

    from asarm_models import Conditionals
    from vllm_anyorder import infill

    want = sequential_infill(Conditionals(asarm).model, INFILL_SEQ, temperature=0.0)
    req = infill.make_request(INFILL_SEQ)
    body = req.openai_body("tiny", temperature=0.0)
    out = requests.post(server + "/v1/completions", json=body, timeout=120)
    assert out.status_code == 200, out.text
    assert req.merge(out.json()["choices"][0]["token_ids"]) == want
    for bad, reason in (({"vllm_xargs": {"anyorder_infill": [0, 0, 3]}}, "distinct"),
                        ({"max_tokens": 3}, "max_tokens"),
                        ({"ignore_eos": False}, "ignore_eos")):
        r = requests.post(server + "/v1/completions", json={**body, **bad}, timeout=60)
        assert r.status_code == 400 and reason in r.text, r.text
    again = requests.post(server + "/v1/completions", json=body, timeout=120)
    assert req.merge(again.json()["choices"][0]["token_ids"]) == want
