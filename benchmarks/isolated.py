"""A benchmark row-run in a child process: one engine alive at a time, and what else ran.

``run_row`` starts a spawned child that builds the row's engine, warms it up (2 prompts),
then per batch setting reads the row's probe, times one pass over the prompts and reads the
probe again; it shuts the engine down and sends back, per pass, outputs, seconds, vLLM's
spec-decode counters and:

* ``engines_alive_max``: vLLM engine-core processes alive on the machine while timing
  (counted by process title before and after the timed pass; 1 = only this row's);
* ``foreign_cpu``: CPU busy time of everything outside the harness (other processes, and the
  hypervisor's steal time), per second of the timed pass, in cores (/proc/stat minus the CPU
  time of the harness's own processes);
and, per row-run, the ``dtype`` the engine ran in and ``start_s``, its start-up time.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

# a row-run is quiet if other processes used at most this many cores on average while it ran
QUIET_FOREIGN_CPU = 0.25
_TITLE = "VLLM::EngineCore"


def wait_quiet(max_s: float) -> float:
    """Wait (at most ``max_s``) until the 1-minute load average is at most half the cores;
    returns the seconds waited. A previous row's engine raises it, so this is also a cooldown."""
    t0 = time.monotonic()
    limit = (os.cpu_count() or 1) / 2
    while os.getloadavg()[0] > limit and time.monotonic() - t0 < max_s:
        time.sleep(2.0)
    return time.monotonic() - t0


def run_row(cfg, model, prompts, params, batches: list[int]) -> dict:
    return run_in_child(_measure, cfg, model, prompts, params, batches, name=cfg.name)


def run_in_child(fn, *args, name: str = ""):
    """``fn(*args)`` in a spawned child process (module-level ``fn``, picklable arguments):
    the engines it starts die with it. Returns its result or raises its exception."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, fn, args), name=f"bench-row {name}",
                        daemon=False)  # vLLM starts its own children
    child.start()
    send.close()
    try:
        result = recv.recv()
    except EOFError:
        child.join()
        raise RuntimeError(f"row {name!r}: child exited with code {child.exitcode}") from None
    child.join()
    if isinstance(result, BaseException):
        raise RuntimeError(f"row {name!r} failed in its child process") from result
    return result


def _child(conn, fn, args) -> None:
    try:
        conn.send(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        try:
            conn.send(exc)
        except Exception:  # an exception that does not pickle
            conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _measure(cfg, model, prompts, params, batches: list[int]) -> dict:
    """Start, warm up, then one timed pass per batch setting (same engine), shut down."""
    from benchmarks.common import close, make_engine, params_for, timed_generate

    os.environ.update(cfg.env or {})  # this child's engine only
    t0 = time.perf_counter()
    llm = make_engine(model, cfg.speculative_config, cfg.additional_config)
    start_s = time.perf_counter() - t0
    llm.generate(prompts[:2], params_for(params, 0, 2), use_tqdm=False)  # warm-up
    dtype = str(llm.llm_engine.vllm_config.model_config.dtype).replace("torch.", "")
    passes = []
    for batch in batches:
        before = cfg.probe(llm) if cfg.probe else {}
        engines = engines_alive()
        cpu0 = cpu_snapshot()
        run = timed_generate(llm, cfg.name, prompts, params, warmup=False, batch=batch)
        cpu1 = cpu_snapshot()
        engines = max(engines, engines_alive())
        after = cfg.probe(llm) if cfg.probe else {}
        foreign = (cpu1[0] - cpu0[0]) - own_cpu(cpu0[1], cpu1[1])
        passes.append(dict(
            batch=batch, outputs=run.outputs, seconds=run.seconds, drafts=run.drafts,
            draft_tokens=run.draft_tokens, accepted=run.accepted,
            accepted_per_pos=run.accepted_per_pos,
            mean_acceptance_length=run.mean_acceptance_length,
            probe={k: after[k] - before.get(k, 0) for k in after}, engines_alive_max=engines,
            foreign_cpu=round(max(0.0, foreign) / run.seconds, 3)))
    close(llm)
    return dict(passes=passes, dtype=dtype, start_s=round(start_s, 1))


def engines_alive() -> int:
    import psutil

    n = 0
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if cmd and cmd[0].startswith(_TITLE):
            n += 1
    return n


def cpu_snapshot() -> tuple[float, dict[int, float]]:
    """(busy CPU seconds of the machine incl. steal, CPU seconds of each harness process)."""
    import psutil

    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    busy = sum(fields[:8]) - fields[3] - fields[4]
    me = psutil.Process()
    own = {}
    for p in [me.parent(), me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            own[p.pid] = t.user + t.system
        except (psutil.Error, AttributeError):
            pass
    return busy / os.sysconf("SC_CLK_TCK"), own


def own_cpu(start: dict[int, float], end: dict[int, float]) -> float:
    return sum(t - start.get(pid, 0.0) for pid, t in end.items())
