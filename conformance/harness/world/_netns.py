"""A private network namespace for one world, its loopback shaped with ``tc tbf``.

The network a local world uses is a memory copy (loopback), so a slow interconnect cannot be
seen there. Here it is made real without leaving the machine:
- **The holder.** A tiny stdlib-only process (this file run as a script) calls
  ``unshare(CLONE_NEWNET)``: it now lives in a namespace of its own whose only interface is a
  fresh ``lo``, down, reaching nothing. It brings that ``lo`` up and then serves one-line
  commands on stdin (``shape RATE BURST LATENCY MTU``, ``unshape [MTU]``) by running ``tc`` inside the
  namespace, answering ``ok`` or ``error ...``. At EOF (the supervisor closed the pipe or died)
  it exits.
- **The ranks join it** (``join``: ``setns`` on ``/proc/<holder>/ns/net``) before they open
  any socket; gloo's sockets and the rendezvous (a FileStore in the world's temp dir: no
  socket at all) then exist only on that namespace's loopback. No address of the host is ever
  bound or reached.
- **Teardown is the kernel's.** A network namespace lives while a process is in it (no
  ``ip netns`` bind mount is ever made), and its ``lo`` and qdisc die with it. The holder
  carries the world's cookie (started inside ``cookie_in_environment``) and dies with its
  parent (PR_SET_PDEATHSIG), so after a SIGKILL of the supervisor the guardian's reap takes it
  with the ranks, and nothing is left: no namespace, no qdisc, no file.

Without the privilege (``unshare``/``setns`` of a network namespace needs CAP_SYS_ADMIN,
``tc`` CAP_NET_ADMIN inside it) or without ``tc``/``ip``, :func:`unavailable_reason` says why and
:class:`PrivateNetwork` raises :class:`NetworkUnavailable`: checks that need it skip with that
reason. Measured on a 2-core host: ``rate 200mbit`` delivers 199 Mbit/s (``netem`` is not
available there, ``tbf`` is).

    net = PrivateNetwork().start()
    net.shape(LinkShape(rate_bits_per_s=200e6))
    ...  # ranks started with netns=net.path
    net.close()

This module imports nothing but the standard library, so it runs as the holder script.
"""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
# linux/capability.h bit numbers, as /proc/self/status shows them in CapEff.
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
#: Loopback's own MTU, restored when a link is unshaped (unless told to keep another).
LOOPBACK_MTU = 1 << 16
#: A shaped link's MTU by default: an Ethernet interconnect's.
ETHERNET_MTU = 1500
_L2_OVERHEAD = 14  # the Ethernet header tbf counts in a loopback packet's length
#: Where the tools live on distributions that keep /usr/sbin out of a user's PATH.
_SBIN = "/usr/sbin:/sbin:/usr/local/sbin"
#: How long starting the holder (an interpreter, ``ip link set lo up``) or one ``tc`` command
#: may take: milliseconds when idle; seconds on a loaded 2-core host.
HOLDER_REPLY_S = 20.0


class NetworkUnavailable(RuntimeError):
    """No private shaped network here (no privilege, no ``tc``): checks that need one skip."""


@dataclass(frozen=True, slots=True)
class LinkShape:
    """A token-bucket link: ``rate_bits_per_s`` sustained, ``burst_bytes`` at line rate after an
    idle moment, packets queued at most ``latency_s`` before they are dropped.

    A shaped loopback gets an Ethernet MTU (``mtu``; loopback's own is 64 KiB): tbf cannot pass
    a packet larger than its burst, and a 64 KiB burst would let a small model's whole
    all-reduce through at memory speed after every idle moment (the forward pass). The
    default burst is 1 ms of the rate, at least two packets; the queue holds a full second, so
    TCP on the shaped loopback is paced, not dropping and retransmitting.
    """

    rate_bits_per_s: float
    burst_bytes: int | None = None
    latency_s: float = 1.0
    mtu: int = ETHERNET_MTU

    def __post_init__(self) -> None:
        if not self.rate_bits_per_s >= 1e5:
            raise ValueError(f"rate_bits_per_s={self.rate_bits_per_s} must be at least 100 kbit/s")
        if not 576 <= self.mtu <= 1 << 16:
            raise ValueError(f"mtu={self.mtu} must be in [576, 65536] bytes")
        if self.burst_bytes is not None and self.burst_bytes < self.mtu + _L2_OVERHEAD:
            raise ValueError(f"burst_bytes={self.burst_bytes} must hold one packet "
                             f"(mtu {self.mtu} + {_L2_OVERHEAD} bytes)")
        if not 0 < self.latency_s <= 10:
            raise ValueError(f"latency_s={self.latency_s} must be in (0, 10] seconds")

    @property
    def burst(self) -> int:
        if self.burst_bytes is not None:
            return self.burst_bytes
        return max(int(self.rate_bits_per_s / 8 * 0.001), 2 * (self.mtu + _L2_OVERHEAD))

    @property
    def gbit_per_s(self) -> float:
        return self.rate_bits_per_s / 1e9

    def command(self) -> str:
        """The holder's command line for this shape."""
        return f"shape {int(self.rate_bits_per_s)} {self.burst} {int(self.latency_s * 1e6)} {self.mtu}"


def find_tool(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SBIN}")


def _effective_caps() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return None


def unavailable_reason(*, tc: str | None = "tc", ip: str | None = "ip", caps: int | None = None) -> str | None:
    """Why no shaped private network can be made here, or None when it can (probably: the
    holder's start is the proof). ``caps`` overrides this process's effective capability mask
    (a test simulating an unprivileged run); ``tc``/``ip``: the tool names or paths looked for."""
    if not os.path.exists("/proc/self/ns/net"):
        return "no network namespaces on this system (Linux only)"
    caps = _effective_caps() if caps is None else caps
    missing = [name for name, bit in (("CAP_SYS_ADMIN", CAP_SYS_ADMIN), ("CAP_NET_ADMIN", CAP_NET_ADMIN))
               if caps is not None and not caps >> bit & 1]
    if missing:
        return (f"a private network namespace needs {' and '.join(missing)} (run as root, or grant "
                f"them to the runner), which this process (uid {os.getuid()}) lacks")
    for tool in (tc, ip):
        if tool is None or find_tool(tool) is None:
            return f"`{tool or 'tc'}` (iproute2) is not installed: the link cannot be shaped; install iproute2"
    return None


class PrivateNetwork:
    """The holder of one private network namespace (see the module docstring)."""

    def __init__(self, *, tc: str = "tc", ip: str = "ip") -> None:
        self._tc, self._ip = tc, ip
        self._proc: subprocess.Popen[str] | None = None
        self.shape_now: LinkShape | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def path(self) -> str:
        """The namespace, as the ranks join it."""
        if self._proc is None:
            raise RuntimeError("the private network is not started")
        return f"/proc/{self._proc.pid}/ns/net"

    def start(self) -> PrivateNetwork:
        """The namespace made, its ``lo`` up. Raises NetworkUnavailable with the reason."""
        reason = unavailable_reason(tc=self._tc, ip=self._ip)
        if reason:
            raise NetworkUnavailable(reason)
        tc, ip = find_tool(self._tc), find_tool(self._ip)
        assert tc is not None and ip is not None
        # -I -S: isolated, no site: starts in ~20 ms and imports nothing of the project. The
        # environment (with the world's cookie, when a World starts it) is inherited on purpose.
        self._proc = subprocess.Popen([sys.executable, "-I", "-S", __file__, str(os.getpid()), tc, ip],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, close_fds=True)
        try:
            self._expect("start")
        except BaseException:
            self.close()
            raise
        return self

    def shape(self, shape: LinkShape | None, *, unshaped_mtu: int = LOOPBACK_MTU) -> None:
        """Shape the namespace's loopback (None: unshaped, the qdisc removed and the MTU set to
        ``unshaped_mtu``: loopback's own, or a shaped link's to compare it with -- the same
        link without its rate limit)."""
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError("the private network is not started")
        if not 576 <= unshaped_mtu <= LOOPBACK_MTU:
            raise ValueError(f"unshaped_mtu={unshaped_mtu} must be in [576, {LOOPBACK_MTU}] bytes")
        try:
            self._proc.stdin.write((shape.command() if shape else f"unshape {unshaped_mtu}") + "\n")
            self._proc.stdin.flush()
        except OSError as exc:
            raise NetworkUnavailable(f"the network holder is gone ({exc})") from None
        self._expect("shape" if shape else "unshape")
        self.shape_now = shape

    def _expect(self, what: str) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], HOLDER_REPLY_S)
        line = self._proc.stdout.readline().strip() if ready else ""
        if line != "ok":
            detail = line.removeprefix("error ") if line else f"no answer within {HOLDER_REPLY_S:g} s"
            raise NetworkUnavailable(f"private network {what} failed: {detail}")

    def close(self) -> None:
        """End the holder; the namespace goes once the ranks in it are gone. Safe twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def join(path: str) -> None:
    """Move the calling thread (and the threads and processes it starts later) into the
    network namespace at ``path``. Raises OSError naming the errno on failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


# -- the holder process -----------------------------------------------------------------------

def _run(argv: list[str]) -> str | None:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HOLDER_REPLY_S)
    if done.returncode == 0:
        return None
    said = (done.stderr or done.stdout).strip().splitlines()
    return f"`{' '.join(argv)}` exited {done.returncode}: {said[-1] if said else 'no message'}"


def _holder_main(parent_pid: int, tc: str, ip: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        return
    if libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        print(f"error unshare(CLONE_NEWNET): {os.strerror(err)} (needs CAP_SYS_ADMIN)", flush=True)
        return
    failed = _run([ip, "link", "set", "lo", "up"])
    print(f"error {failed}" if failed else "ok", flush=True)
    if failed:
        return
    for line in sys.stdin:
        op, *args = line.split()
        if op == "shape" and len(args) == 4:
            rate, burst, latency_us, mtu = args
            failed = _run([ip, "link", "set", "lo", "mtu", mtu]) or _run(
                [tc, "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", f"{rate}bit",
                 "burst", burst, "latency", f"{latency_us}us"])
        elif op == "unshape" and len(args) <= 1:
            failed = _run([tc, "qdisc", "del", "dev", "lo", "root"])
            if failed and ("No such file" in failed or "handle of zero" in failed):
                failed = None  # nothing to remove: already unshaped
            failed = failed or _run([ip, "link", "set", "lo", "mtu", args[0] if args else str(LOOPBACK_MTU)])
        else:
            failed = f"unknown command {line.strip()!r}"
        print(f"error {failed}" if failed else "ok", flush=True)


if __name__ == "__main__":
    _holder_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
