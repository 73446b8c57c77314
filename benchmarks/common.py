"""Shared harness for the demo and the benchmarks: one engine per method, warmed up, the
same prompts, vLLM's own spec-decode counters read before/after (deltas)."""

from __future__ import annotations

import functools
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
# at once; vLLM's CPU backend zero-fills it, so it is resident memory of every engine.
# dtype: chosen by the CPU (cpu_dtype), unless a caller overrides it.
ENGINE_ARGS = dict(enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=1 << 26,
                   disable_log_stats=False, seed=0)

# CPU flags that decide how fast a bf16 / fp32 matmul runs
MATMUL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


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


def _cpuinfo(key: str) -> str | None:
    """The value of the first ``key`` line of /proc/cpuinfo (None off Linux or if absent)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    return set((_cpuinfo("flags") or "").split())


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_dtype() -> tuple[str, str]:
    """(dtype, why) for the project's own commands: bf16 only where the CPU multiplies bf16
    natively (AVX512_BF16 or AMX); elsewhere bf16 matmuls are emulated, their cost grows with
    the rows, and verifying k drafts costs several times one token, so fp32.
    ``ANYORDER_DTYPE`` (e.g. ``bfloat16``) overrides the choice."""
    forced = os.environ.get("ANYORDER_DTYPE")
    if forced:
        return forced, "ANYORDER_DTYPE"
    native = sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    if native:
        return "bfloat16", f"CPU multiplies bf16 natively ({', '.join(native)})"
    return "float32", "no AVX512_BF16 / AMX on this CPU: bf16 matmuls would be emulated"


def machine_info() -> dict:
    """What a timing depends on: CPU model, cores, matmul flags, load average."""
    flags = cpu_flags()
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "host": platform.node(),
            "flags": {f: f in flags for f in MATMUL_FLAGS}, "loadavg": list(os.getloadavg())}


def machine() -> str:
    info = machine_info()
    flags = ",".join(f for f, on in info["flags"].items() if on) or "no matmul flags"
    return f"{info['cpu']}, {info['cpus']} CPUs, {flags} ({info['host']})"


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


def timed_method(owner, name: str, record) -> None:
    """Wrap ``owner.name`` (a class's method, for an engine in this process) so that every
    call also runs ``record(seconds, args, kwargs)`` with the call's wall time. The
    in-process harnesses (``bench_step_overhead``, ``bench_first_shapes``) time vLLM's and
    the proposer's methods this way; the worker-side diagnostic is the ``step_timing`` patch."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record(time.perf_counter() - start, args, kwargs)

    setattr(owner, name, timed)


def make_engine(model: Path, speculative_config: dict | None = None,
                additional_config: dict | None = None, **overrides):
    from vllm import LLM

    global _ENGINES
    _ENGINES += 1
    kwargs = {**ENGINE_ARGS, "dtype": cpu_dtype()[0],
              "served_model_name": f"{Path(model).name}#{_ENGINES}", **overrides}
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


def repetition_share(outputs: list[list[int]], n: int = 4) -> float:
    """Share of the outputs' n-grams that already occurred earlier in the same output (the
    project's tiny targets loop, which flatters n-gram and Jacobi drafts: printed with every
    table)."""
    total = repeated = 0
    for out in outputs:
        seen: set[tuple[int, ...]] = set()
        for i in range(len(out) - n + 1):
            gram = tuple(out[i: i + n])
            repeated += gram in seen
            seen.add(gram)
            total += 1
    return repeated / max(1, total)
