"""A real, throw-away SLURM cluster on this one host: munged, slurmctld and one ``slurmd -N nodeN``
per emulated node, all as root and without systemd.

Everything (config, munge key and socket, spool, logs) lives under one state directory; nothing
is written to /etc/slurm or /etc/munge. Node names get ``127.0.0.1 nodeN`` lines in /etc/hosts
when they do not resolve yet (MASTER_ADDR is the first host of ``scontrol show hostnames``), and
exactly those lines are removed again on :meth:`LocalSlurm.stop`. Each node advertises
``gpus_per_node`` fake GPUs (character devices like /dev/null), so ``--gpus-per-node`` requests
work and set ``CUDA_VISIBLE_DEVICES``; torch on a CPU machine still trains with gloo.

:meth:`LocalSlurm.stop` cancels the remaining jobs, then stops exactly the daemons that
:meth:`LocalSlurm.start` launched, by their PIDs (``Popen`` handles), never by name.

Needs Debian's ``slurmctld slurmd slurm-client munge`` packages (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import string
import subprocess
import time
from pathlib import Path

CONF_TEMPLATE = Path(__file__).with_name("slurm.conf.in")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo")
HOSTS_FILE = "/etc/hosts"


def missing_binaries() -> list[str]:
    """The SLURM and munge programs that are not on PATH."""
    return [b for b in BINARIES if shutil.which(b) is None]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class LocalSlurm:
    """Start and stop a local SLURM cluster of ``nodes`` emulated nodes.

    Args:
        state_dir: directory for config, key, sockets, spool and logs (keep it short: the munge
            socket path must stay under 108 characters).
        nodes: number of emulated nodes (``node1`` .. ``nodeN``).
        gpus_per_node: fake GPUs advertised by each node as ``gres/gpu``.
    """

    def __init__(self, state_dir: str | os.PathLike, nodes: int = 2, gpus_per_node: int = 2):
        self.state = Path(state_dir).resolve()
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.conf = self.state / "etc" / "slurm.conf"
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._hosts_line: str | None = None

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus ``SLURM_CONF`` pointing at this cluster (clients need it)."""
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=30)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.state / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen(
            cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        self._procs.append((name, proc))
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at once; see {self.state}/log/{name}.out")

    def _log_tail(self, name: str, lines: int = 30) -> str:
        path = self.state / "log" / name
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def start(self) -> dict[str, str]:
        """Bring the cluster up and wait until every node is idle.

        Returns:
            The environment for SLURM clients (``SLURM_CONF`` set).

        Raises:
            RuntimeError / TimeoutError: a daemon did not come up (the cluster is stopped again).
        """
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self.env

    def _start(self) -> None:
        for sub in ("etc", "munge", "ctld", "log", "run"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        self._add_hosts()
        self._start_munge()
        self._write_config()
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)])
        _wait_until(
            lambda: "UP" in self._run("scontrol", "ping").stdout,
            30,
            "slurmctld: " + self._log_tail("slurmctld.log"),
        )
        for n in range(1, self.nodes + 1):
            (self.state / f"spool-node{n}").mkdir(exist_ok=True)
            self._spawn(f"slurmd-node{n}", ["slurmd", "-D", "-N", f"node{n}", "-f", str(self.conf)])

        def all_idle() -> bool:
            out = self._run("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").stdout.split()
            return len(out) >= self.nodes

        _wait_until(all_idle, 60, "idle nodes: " + self._log_tail("slurmctld.log"))

    def _start_munge(self) -> None:
        munge = self.state / "munge"
        munge.chmod(0o700)
        key = munge / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        sock = munge / "munge.socket"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={munge}/munged.pid",
                f"--seed-file={munge}/munged.seed",
                f"--log-file={self.state}/log/munged.log",
                "--num-threads=2",
            ],
        )
        _wait_until(sock.exists, 10, "the munge socket: " + self._log_tail("munged.log"))

    def _write_config(self) -> None:
        ctld_port, *node_ports = _free_ports(1 + self.nodes)
        gres = ""
        if self.gpus_per_node:
            devices = []
            for g in range(self.gpus_per_node):
                dev = self.state / f"fakegpu{g}"
                if not dev.exists():
                    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                devices.append(str(dev))
            (self.state / "etc" / "gres.conf").write_text(
                "".join(f"Name=gpu File={d}\n" for d in devices)
            )
            gres = f" Gres=gpu:{self.gpus_per_node}"
        host = socket.gethostname().split(".")[0]
        node_lines = "\n".join(
            f"NodeName=node{n} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN{gres}"
            for n, port in enumerate(node_ports, start=1)
        )
        text = string.Template(CONF_TEMPLATE.read_text()).substitute(
            host=host,
            ctld_port=ctld_port,
            state=self.state,
            node_lines=node_lines,
            node_list=",".join(f"node{n}" for n in range(1, self.nodes + 1)),
        )
        self.conf.write_text(text)

    def _add_hosts(self) -> None:
        names = []
        for n in range(1, self.nodes + 1):
            try:
                socket.gethostbyname(f"node{n}")
            except OSError:
                names.append(f"node{n}")
        if names:
            self._hosts_line = f"127.0.0.1 {' '.join(names)}  # megatron-gamma test cluster\n"
            with open(HOSTS_FILE, "a") as f:
                f.write(self._hosts_line)

    def _remove_hosts(self) -> None:
        if self._hosts_line is None:
            return
        with open(HOSTS_FILE) as f:
            lines = f.readlines()
        if self._hosts_line in lines:
            lines.remove(self._hosts_line)
            with open(HOSTS_FILE, "w") as f:
                f.writelines(lines)
        self._hosts_line = None

    def _cancel_all_jobs(self) -> None:
        """Cancel what is still queued or running and wait (<= 20 s) until it has gone, so that
        no slurmstepd or job process outlives its slurmd."""
        ctld = dict(self._procs).get("slurmctld")
        if ctld is None or ctld.poll() is not None:
            return
        jobs = self._run("squeue", "-h", "-o", "%A").stdout.split()
        if not jobs:
            return
        self._run("scancel", "--full", *sorted(set(jobs)))
        try:
            _wait_until(lambda: not self._run("squeue", "-h", "-o", "%A").stdout.strip(), 20, "")
        except TimeoutError:
            pass

    @staticmethod
    def _terminate(procs: list[subprocess.Popen], grace: float = 10.0) -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop(self) -> None:
        """Cancel remaining jobs, stop the daemons this object started (by PID), restore
        /etc/hosts. Safe to call more than once."""
        try:
            self._cancel_all_jobs()
        finally:
            # slurmd(s) and slurmctld first (they still talk to munged while shutting down).
            self._terminate([p for name, p in self._procs if name != "munged"])
            self._terminate([p for name, p in self._procs if name == "munged"])
            self._procs.clear()
            self._remove_hosts()


FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


def job_states(job_id: str, env: dict) -> set[str]:
    """The JobState of every task of ``job_id`` (one for a plain job), from scontrol."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True
    ).stdout
    return {w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")}


def wait_job(job_id: str, env: dict, timeout: float) -> str:
    """Poll until every task of job ``job_id`` is in a final state (a requeued job is not) and
    return the states joined by ``,`` (``COMPLETED`` when all succeeded).

    ``sbatch --wait`` would do, but it polls after 2 s, 8 s, 32 s...; this polls every 0.2 s.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = job_states(job_id, env)
        if states and states <= FINAL_STATES:
            return ",".join(sorted(states))
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} not finished after {timeout:.0f}s: {job_states(job_id, env)}")


def job_field(job_id: str, env: dict, name: str) -> str:
    """One field of ``scontrol show job`` (e.g. ``Restarts``) of a (non-array) job."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True
    ).stdout
    for word in out.split():
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    raise KeyError(f"{name} not in scontrol show job {job_id}: {out[:300]}")
