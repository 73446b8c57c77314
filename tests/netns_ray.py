"""Two Ray nodes on one machine, each in its own network namespace (tests only).

A veth pair joins the namespaces; its addresses (``HEAD_IP``, ``WORKER_IP``) exist only
inside them, so every byte between the nodes crosses that link. Each node also gets its own
mount namespace with a private ``/dev/shm`` (as two machines have): shared-memory shortcuts
between the nodes fail instead of silently working. The head's processes and whatever runs
"on the head" (:meth:`TwoNodeRay.head_cmd`: the engine, the API server, curl) share its
namespaces; the worker node is a second ``ray start --address``.

Nothing here uses ``ray stop``: it finds Ray processes by name across the whole machine (the
PID namespace is shared) and would stop other Ray clusters. A node is stopped by killing
every process in its network namespace (``ip netns pids``), which is what ``ray stop
--force`` does to a node's processes; :meth:`TwoNodeRay.close` does that for both nodes and
deletes the namespaces (the veth pair goes with them).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAD_IP, WORKER_IP = "10.77.0.1", "10.77.0.2"
RAY_PORT = 6379  # inside the head's namespace: no other cluster can hold it


def unavailable() -> str | None:
    """Why two namespaced Ray nodes cannot run here (None when they can)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "needs Linux and root (ip netns, veth, mount namespaces)"
    for tool in ("ip", "unshare", "nsenter", "curl"):
        if shutil.which(tool) is None:
            return f"needs the '{tool}' command"
    probe = f"aoprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"'ip netns add' fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class TwoNodeRay:
    """Head node (1 CPU, ``HEAD_IP``) and worker node (1 CPU, ``WORKER_IP``), token auth."""

    def __init__(self, ray_cli: str | None = None):
        tag = f"ao{os.getpid() % 100000}{secrets.token_hex(2)}"  # unique per run, <= 11 chars
        self.ns = {"head": f"{tag}h", "worker": f"{tag}w"}
        self.ifname = {"head": f"{tag}h0", "worker": f"{tag}w0"}
        self.ip = {"head": HEAD_IP, "worker": WORKER_IP}
        self.ray_cli = ray_cli or str(Path(sys.executable).with_name("ray"))
        self.tmp = Path(tempfile.mkdtemp(prefix="ray2n", dir="/tmp"))  # Ray's paths are long
        self.token = secrets.token_hex(32)
        self.nodes: dict[str, subprocess.Popen] = {}
        self.address = f"{HEAD_IP}:{RAY_PORT}"

    # --- the network ---
    def create(self) -> None:
        for ns in self.ns.values():
            _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", self.ifname["head"], "type", "veth",
            "peer", "name", self.ifname["worker"])
        for node, ns in self.ns.items():
            _sh("ip", "link", "set", self.ifname[node], "netns", ns)
            _sh("ip", "-n", ns, "addr", "add", f"{self.ip[node]}/24", "dev", self.ifname[node])
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "link", "set", self.ifname[node], "up")

    # --- Ray nodes ---
    def node_env(self, node: str) -> dict[str, str]:
        """What each node's ``ray start`` needs (the README recipe): the token, gloo's and
        vLLM's view of this node's address, and the core its one rank binds to."""
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                "RAY_USAGE_STATS_ENABLED": "0", "GLOO_SOCKET_IFNAME": self.ifname[node],
                "VLLM_HOST_IP": self.ip[node],
                "VLLM_CPU_OMP_THREADS_BIND": "0" if node == "head" else "1"}

    def start(self, node: str, timeout: float = 120) -> None:
        """``ray start --block`` for ``node`` in its namespaces; returns once it runs."""
        where = ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"] \
            if node == "head" else [f"--address={self.address}"]
        ray = [self.ray_cli, "start", "--block", *where, f"--node-ip-address={self.ip[node]}",
               "--num-cpus=1", "--num-gpus=0", "--disable-usage-stats",
               f"--temp-dir={self.tmp / node}"]
        inner = "mount -t tmpfs tmpfs /dev/shm && exec " + " ".join(ray)
        log_path = self.tmp / f"{node}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(["ip", "netns", "exec", self.ns[node], "unshare", "-m",
                                     "--propagation", "private", "sh", "-c", inner],
                                    stdout=log, stderr=subprocess.STDOUT, env=self.node_env(node))
        self.nodes[node] = proc
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = log_path.read_text()
            if proc.poll() is not None:
                raise RuntimeError(f"ray {node} node exited:\n{text[-3000:]}")
            if "will now block" in text:
                return
            time.sleep(0.5)
        raise RuntimeError(f"ray {node} node did not start:\n{log_path.read_text()[-3000:]}")

    def kill(self, node: str) -> float:
        """Kill every process of ``node`` at once (a crashed or force-stopped node); returns
        the time of the kill."""
        t = time.time()
        self._kill_namespace(self.ns[node])
        proc = self.nodes.pop(node, None)
        if proc is not None:
            proc.wait(timeout=30)
        return t

    def _kill_namespace(self, ns: str) -> None:
        for _ in range(20):
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            pids = [int(p) for p in out.stdout.split()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)

    # --- running things on the head node ---
    def head_cmd(self, *cmd: str) -> list[str]:
        """``cmd`` inside the head node's network and mount namespaces (its /dev/shm)."""
        return ["nsenter", "-t", str(self.nodes["head"].pid), "-n", "-m", "--", *cmd]

    def driver_env(self) -> dict[str, str]:
        """The client side of the recipe: RAY_ADDRESS and the token (plus the head's IP)."""
        return {**os.environ, "RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": self.token, "VLLM_HOST_IP": HEAD_IP}

    def curl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """curl on the head node (the server listens on the head's loopback)."""
        return subprocess.run(self.head_cmd("curl", "-sS", "-m", str(int(timeout)), *args),
                              capture_output=True, text=True, timeout=timeout + 30)

    def close(self) -> None:
        """Kill every process in both namespaces, delete them (and the veth), remove files."""
        for node in ("worker", "head"):
            self._kill_namespace(self.ns[node])
            proc = self.nodes.pop(node, None)
            if proc is not None:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            subprocess.run(["ip", "netns", "del", self.ns[node]], capture_output=True)
        # a veth end left in the root namespace if create() stopped half-way
        subprocess.run(["ip", "link", "del", self.ifname["head"]], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
