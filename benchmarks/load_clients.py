"""HTTP side of the load / fault test: workloads, concurrent clients, faults, bad input.

Everything talks to an OpenAI-compatible ``vllm-anyorder serve`` on loopback with ``httpx``
(asyncio). Workloads are deterministic for a seed, so the same greedy requests can be sent to
the server under test and to the no-speculation reference server and compared.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx

MODEL = "m"  # --served-model-name of every server the driver starts


@dataclass
class Result:
    key: int
    ok: bool
    greedy: bool
    text: str = ""
    finish: str | None = None
    status: int = 0
    error: str = ""


def workload(seed: int, prompts: list[str], n: int, max_tokens: int) -> list[dict]:
    """``n`` completion requests: mixed prompt lengths (cut at random points), ``max_tokens``
    in [1, max_tokens], half greedy, the rest at temperature 0.7 / 1.0 (some with top-p /
    top-k), some with stop strings, half streamed, a few through the chat endpoint."""
    rng = random.Random(seed)
    out = []
    for key in range(n):
        base = prompts[rng.randrange(len(prompts))]
        prompt = base[: rng.randint(1, len(base))]
        body = {"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(1, max_tokens),
                "temperature": 0.0, "seed": key}
        if rng.random() < 0.5:
            body["temperature"] = rng.choice([0.7, 1.0])
            if rng.random() < 0.5:
                body["top_p"], body["top_k"] = 0.9, 20
        if rng.random() < 0.3:
            body["stop"] = [rng.choice(["\n\n", "e", " ", "):", "k"])]
        if rng.random() < 0.2:
            body["ignore_eos"] = True
        chat = rng.random() < 0.15
        out.append({"key": key, "body": body, "stream": rng.random() < 0.5, "chat": chat})
    return out


def _endpoint(req: dict) -> tuple[str, dict]:
    body = dict(req["body"])
    if req["chat"]:
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
        return "/v1/chat/completions", body
    return "/v1/completions", body


def _text(choice: dict, chat: bool, stream: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    part = choice.get("delta" if stream else "message") or {}
    return part.get("content") or ""


async def one(client: httpx.AsyncClient, req: dict, timeout: float) -> Result:
    path, body = _endpoint(req)
    res = Result(req["key"], False, body["temperature"] == 0.0)
    try:
        if not req["stream"]:
            r = await client.post(path, json=body, timeout=timeout)
            res.status = r.status_code
            if r.status_code != 200:
                res.error = r.text[:300]
                return res
            choice = r.json()["choices"][0]
            res.text, res.finish = _text(choice, req["chat"], False), choice["finish_reason"]
        else:
            parts = []
            async with client.stream("POST", path, json={**body, "stream": True},
                                     timeout=timeout) as r:
                res.status = r.status_code
                if r.status_code != 200:
                    res.error = (await r.aread()).decode()[:300]
                    return res
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        res.error = json.dumps(chunk)[:300]
                        return res
                    for choice in chunk.get("choices", []):
                        parts.append(_text(choice, req["chat"], True))
                        res.finish = choice.get("finish_reason") or res.finish
            res.text = "".join(parts)
        res.ok = res.finish in ("stop", "length")
        if not res.ok:
            res.error = f"finish_reason={res.finish!r}"
    except Exception as exc:  # a client-side failure is a failed request, not a crash
        res.error = f"{type(exc).__name__}: {exc}"[:300]
    return res


async def run_round(base: str, reqs: list[dict], concurrency: int,
                    timeout: float = 600.0) -> tuple[list[Result], float]:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base, limits=limits) as client:
        async def guarded(req):
            async with sem:
                return await one(client, req, timeout)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(guarded(r) for r in reqs))
        return list(results), time.perf_counter() - t0


async def pressure(base: str, prompt: str, max_tokens: int, n: int = 3) -> list[str]:
    """``n`` concurrent greedy requests of ``max_tokens`` each (together more than the KV cache
    holds: the scheduler must preempt and recompute); their texts, in order."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    async with httpx.AsyncClient(base_url=base) as client:
        rs = await asyncio.gather(*(client.post("/v1/completions", json={**body, "seed": i},
                                                timeout=600) for i in range(n)))
    return [r.json()["choices"][0]["text"] if r.status_code == 200 else f"HTTP {r.status_code}"
            for r in rs]


async def faults(base: str, prompt: str, too_long: str, n: int = 4,
                 max_tokens: int = 400) -> dict:
    """Clients that vanish: ``n`` streams closed after two chunks, ``n`` non-streaming
    requests cancelled after 0.3 s, ``n`` streams cancelled after 0.05 s; and two
    requests longer than the model allows (prompt alone; prompt + max_tokens)."""
    out = {"disconnected_mid_stream": 0, "cancelled": 0, "too_long_status": []}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    async with httpx.AsyncClient(base_url=base) as client:
        async def drop_stream():
            async with client.stream("POST", "/v1/completions", json={**body, "stream": True},
                                     timeout=120) as r:
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= 2:
                        out["disconnected_mid_stream"] += 1
                        return  # leaving the block closes the connection mid-stream

        async def cancel(stream: bool, after: float):
            try:
                if stream:
                    await asyncio.wait_for(drop_stream_forever(), after)
                else:
                    await asyncio.wait_for(client.post("/v1/completions", json=body,
                                                       timeout=120), after)
            except asyncio.TimeoutError:
                out["cancelled"] += 1

        async def drop_stream_forever():
            async with client.stream("POST", "/v1/completions", json={**body, "stream": True},
                                     timeout=120) as r:
                async for _ in r.aiter_lines():
                    pass

        await asyncio.gather(*[drop_stream() for _ in range(n)],
                             *[cancel(False, 0.3) for _ in range(n)],
                             *[cancel(True, 0.05) for _ in range(n)])
        for extra in ({"prompt": too_long, "max_tokens": 4},
                      {"prompt": prompt, "max_tokens": 10 ** 6}):
            r = await client.post("/v1/completions", json={**body, **extra}, timeout=60)
            out["too_long_status"].append(r.status_code)
    return out


def bad_inputs(prompt: str) -> dict[str, dict | str]:
    """Requests every method must refuse with an HTTP 4xx (name -> JSON body, or raw text)."""
    ok = {"model": MODEL, "prompt": prompt, "max_tokens": 8}
    return {
        "min_p (ignored by vLLM's speculative path)": {**ok, "min_p": 0.2},
        "logit_bias (ignored by vLLM's speculative path)": {**ok, "logit_bias": {"5": 10.0}},
        "negative max_tokens": {**ok, "max_tokens": -3},
        "negative temperature": {**ok, "temperature": -1.0},
        "top_p > 1": {**ok, "top_p": 5.0},
        "top_k < -1": {**ok, "top_k": -7},
        "n = 0": {**ok, "n": 0},
        "huge logprobs": {**ok, "logprobs": 10 ** 6},
        "temperature NaN-like string": {**ok, "temperature": "hot"},
        "prompt of out-of-vocabulary ids": {**ok, "prompt": [10 ** 9, -5]},
        "unknown model": {**ok, "model": "nope"},
        "malformed infill positions": {**ok, "vllm_xargs": {"anyorder_infill": [-4, 10 ** 7]}},
        "malformed JSON": '{"model": "m", "prompt": ',
    }


async def send_bad_inputs(base: str, prompt: str) -> dict[str, int]:
    status = {}
    async with httpx.AsyncClient(base_url=base) as client:
        for name, body in bad_inputs(prompt).items():
            if isinstance(body, str):
                r = await client.post("/v1/completions", content=body, timeout=60,
                                      headers={"content-type": "application/json"})
            else:
                r = await client.post("/v1/completions", json=body, timeout=60)
            status[name] = r.status_code
    return status


def metric(base: str, name: str) -> float:
    """Sum of a Prometheus series from /metrics (0 if absent)."""
    text = httpx.get(base + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + "{", name + " ")))


def _worker_rpc(base: str, method: str, args: list[str] | None = None,
                timeout: float = 60) -> list:
    """Per-rank results of a worker-extension method over vLLM's dev-mode ``/collective_rpc``
    (needs VLLM_SERVER_DEV_MODE=1 and the worker extension)."""
    r = httpx.post(base + "/collective_rpc", json={"method": method, "args": args or []},
                   timeout=timeout)
    r.raise_for_status()
    return r.json()["results"]


def worker_state(base: str) -> list[dict]:
    """Per-rank ``anyorder_state``."""
    return _worker_rpc(base, "anyorder_state")


def worker_memory(base: str) -> list[dict]:
    """Per-rank ``anyorder_memory``: live tensor MB vs the C heap's in-use / free MB."""
    return _worker_rpc(base, "anyorder_memory", timeout=120)


def worker_set_budget_mode(base: str, mode: str) -> list:
    """Switch a live server's budget controller (``anyorder_set_budget_mode``)."""
    return _worker_rpc(base, "anyorder_set_budget_mode", [mode])
