"""Shared harness for the demo and the benchmarks: one engine per method, warmed up, the
same prompts, vLLM's own spec-decode counters read before/after (deltas)."""

from __future__ import annotations

import gc
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "models" / "ar-target"

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# 64 MiB of KV cache: ~16k tokens of these 4-layer models, far more than a benchmark holds
# at once; vLLM's CPU backend zero-fills it, so it is resident memory of every engine
ENGINE_ARGS = dict(enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=1 << 26,
                   disable_log_stats=False, seed=0, dtype="bfloat16")


@dataclass
class Run:
    name: str
    outputs: list[list[int]]
    seconds: float
    drafts: int = 0  # verification steps that carried drafts (vLLM: num_drafts)
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @property
    def generated(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.seconds

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens committed per target forward of a speculating request (1 + accepted)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs ({platform.node()})"


def _spec_counters(llm) -> dict:
    """This engine's spec-decode counters. vLLM keeps metrics in the process-wide Prometheus
    registry, so engines in one process are told apart by their ``model_name`` label
    (``make_engine`` gives each a distinct served model name)."""
    name = llm.llm_engine.vllm_config.model_config.served_model_name
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode") and m.labels.get("model_name") == name:
            out[m.name] = getattr(m, "values", None) or getattr(m, "value", 0)
    return out


_ENGINES = 0


def make_engine(model: Path, speculative_config: dict | None = None,
                additional_config: dict | None = None, **overrides):
    from vllm import LLM

    global _ENGINES
    _ENGINES += 1
    kwargs = {**ENGINE_ARGS, "served_model_name": f"{Path(model).name}#{_ENGINES}", **overrides}
    if speculative_config:
        kwargs["speculative_config"] = speculative_config
    if additional_config:
        kwargs["additional_config"] = additional_config
    return LLM(str(model), **kwargs)


def params_for(params, start: int, stop: int):
    """The sampling parameters of prompts[start:stop]: ``params`` is one ``SamplingParams``
    for every prompt or a list with one per prompt (e.g. infill requests)."""
    return params[start:stop] if isinstance(params, list) else params


def timed_generate(llm, name: str, prompts: list, params, warmup: bool = True,
                   batch: int = 0) -> Run:
    """Generate and time; ``batch=0`` submits all prompts at once, ``batch=b`` submits them
    b at a time (``batch=1``: one request at a time, the latency setting). ``prompts``: text
    or vLLM prompt dicts; ``params``: one ``SamplingParams`` or a list, one per prompt."""
    if warmup:
        llm.generate(prompts[:2], params_for(params, 0, 2), use_tqdm=False)
    before = _spec_counters(llm)
    step = batch or len(prompts)
    t0 = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), step):
        outs += llm.generate(prompts[i : i + step], params_for(params, i, i + step),
                             use_tqdm=False)
    seconds = time.perf_counter() - t0
    after = _spec_counters(llm)

    def delta(key):
        a, b = after.get(key, 0), before.get(key, 0)
        if isinstance(a, list):
            b = b or [0] * len(a)
            return [x - y for x, y in zip(a, b)]
        return a - b

    return Run(
        name=name,
        outputs=[list(o.outputs[0].token_ids) for o in outs],
        seconds=seconds,
        drafts=delta("vllm:spec_decode_num_drafts") or 0,
        draft_tokens=delta("vllm:spec_decode_num_draft_tokens") or 0,
        accepted=delta("vllm:spec_decode_num_accepted_tokens") or 0,
        accepted_per_pos=delta("vllm:spec_decode_num_accepted_tokens_per_pos") or [],
    )


def close(llm) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()


def load_prompts(n: int, prompt_tokens: int = 48) -> list[str]:
    """Benchmark-split prompts (files never seen in training); see training/data.py."""
    import sys

    sys.path.insert(0, str(REPO))
    from training.data import benchmark_prompts

    return benchmark_prompts(n, prompt_tokens)
