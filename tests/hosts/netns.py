"""Hosts on one machine: network namespaces on a private bridge.

Hosts(n) makes n namespaces, each with lo up and one veth (eth0 inside) plugged into a bridge of
this run in the root namespace; host i has 198.18.<run>.<i+1>/24 (198.18.0.0/15 is reserved for
benchmarking, RFC 2544: never routed anywhere). Commands run in a host also get a UTS namespace
whose host name is the namespace's name, and an /etc/hosts (iproute2 bind-mounts
/etc/netns/<name>/hosts over it) in which every host's name resolves to its address: the host
names, and host names in a Slurm node list, mean what they mean on a cluster. Nothing is routed out of the bridge: traffic stays
between our own namespaces. Names carry the pid (fh<pid>h<i>, fb<pid>, fv<pid>h<i>, all <= 15
characters) so parallel runs cannot collide; namespaces and bridges of dead pids are deleted when
a new run starts, and a run deletes its own on close() (also at exit and on SIGTERM).

    with Hosts(2) as hosts:
        p = hosts.popen(0, ["prog"], env)      # ip netns exec fh..h0 prog
        hosts.counters(1)                      # {"tx_bytes": ..., "rx_bytes": ...} of eth0
        hosts.rate_limit(1, "200mbit")         # tbf on host 1's egress
        hosts.link_down(1)                     # ip link set eth0 down inside host 1

unavailable() says why namespaces cannot be made here (not root, no `ip`, `ip netns add`
refused), or None.
"""
import atexit
import os
import re
import shutil
import signal
import subprocess

PREFIX_NS = "fh"
PREFIX_BR = "fb"
PREFIX_VETH = "fv"
_NAME_RE = re.compile(r"^f[hbv](\d+)(?:h\d+)?$")


def _ip(*args, check=True, netns=None):
    cmd = (["ip", "netns", "exec", netns] if netns else []) + ["ip", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
    return r


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(name):
    r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _remove_etc(name):
    shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


def cleanup_stale():
    """Deletes namespaces and bridges/veths named by this module whose pid is dead."""
    if shutil.which("ip") is None:
        return
    for name in os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []:
        m = _NAME_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _remove_etc(name)
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME_RE.match(name)
        if m and name.startswith(PREFIX_NS) and not _pid_alive(int(m.group(1))):
            _kill_inside(name)  # ranks its dead owner left running would keep the namespace alive
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = _NAME_RE.match(name)
        if m and (name.startswith(PREFIX_BR) or name.startswith(PREFIX_VETH)) \
                and not _pid_alive(int(m.group(1))):
            subprocess.run(["ip", "link", "delete", name], capture_output=True)


def unavailable():
    """Why hosts cannot be made here, or None. Tries a throwaway namespace."""
    if os.geteuid() != 0:
        return "not root (network namespaces need CAP_SYS_ADMIN/CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{PREFIX_NS}{os.getpid()}h99"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    r = subprocess.run(["ip", "link", "add", f"{PREFIX_BR}{os.getpid()}x", "type", "bridge"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot make a bridge: {r.stderr.strip()}"
    subprocess.run(["ip", "link", "delete", f"{PREFIX_BR}{os.getpid()}x"], capture_output=True)
    return None


class Hosts:
    def __init__(self, n, run=None):  # run: third octet (default pid % 256)
        assert 1 <= n <= 250
        cleanup_stale()
        pid = os.getpid()
        self.n = n
        # Namespaces do not share routing tables, so two runs with the same third octet do not
        # interfere; the pid just makes addresses easy to tell apart in captures.
        self.subnet = (pid % 256) if run is None else run
        self.bridge = f"{PREFIX_BR}{pid}"
        self.names = [f"{PREFIX_NS}{pid}h{i}" for i in range(n)]
        self.veths = [f"{PREFIX_VETH}{pid}h{i}" for i in range(n)]
        self.addresses = [f"198.18.{self.subnet}.{i + 1}" for i in range(n)]
        assert all(len(x) <= 15 for x in [self.bridge, *self.names, *self.veths])
        self._closed = False
        self._procs = []
        atexit.register(self.close)
        self._old_term = signal.signal(signal.SIGTERM, self._on_term)
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _on_term(self, signum, frame):
        self.close()
        raise SystemExit(128 + signum)

    def _make(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for name, veth, addr in zip(self.names, self.veths, self.addresses):
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
            _ip("link", "set", "lo", "up", netns=name)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("addr", "add", f"{addr}/24", "dev", "eth0", netns=name)
            _ip("link", "set", "eth0", "up", netns=name)
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in zip(self.names, self.addresses))
        for name in self.names:
            os.makedirs(f"/etc/netns/{name}", exist_ok=True)
            with open(f"/etc/netns/{name}/hosts", "w") as f:
                f.write(hosts)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Running things inside a host.
    def exec_args(self, host, cmd):
        # Each step execs the next (ip, unshare, sh): the pid of a Popen is the program's own.
        name = self.names[host]
        return ["ip", "netns", "exec", name, "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', name, *cmd]

    def popen(self, host, cmd, env=None, **kwargs):
        p = subprocess.Popen(self.exec_args(host, cmd), env=env, **kwargs)
        self._procs.append(p)
        return p

    def run(self, host, cmd, env=None, **kwargs):
        return subprocess.run(self.exec_args(host, cmd), env=env, **kwargs)

    # The kernel's view of a host's link.
    def counters(self, host):
        out = {}
        for key in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets"):
            r = self.run(host, ["cat", f"/sys/class/net/eth0/statistics/{key}"],
                         capture_output=True, text=True, check=True)
            out[key] = int(r.stdout.strip())
        return out

    def rate_limit(self, host, rate, burst="256kb", latency="100ms"):
        """Token bucket on host's egress (eth0 inside the namespace); rate None removes it."""
        _ip("link", "show", "eth0", netns=self.names[host])
        subprocess.run(["ip", "netns", "exec", self.names[host], "tc", "qdisc", "del", "dev", "eth0",
                        "root"], capture_output=True)
        if rate is not None:
            r = subprocess.run(["ip", "netns", "exec", self.names[host], "tc", "qdisc", "add", "dev",
                                "eth0", "root", "tbf", "rate", rate, "burst", burst, "latency",
                                latency], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"tc tbf on {self.names[host]}: {r.stderr.strip()}")

    def link_down(self, host):
        _ip("link", "set", "eth0", "down", netns=self.names[host])

    def link_up(self, host):
        _ip("link", "set", "eth0", "up", netns=self.names[host])

    def close(self):
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.kill()
                    p.wait(timeout=10)
                except Exception:
                    pass
        # Processes still inside a namespace (children that outlived `ip netns exec`).
        for name in self.names:
            _kill_inside(name)
        for name in self.names:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
            _remove_etc(name)
        for veth in self.veths:
            subprocess.run(["ip", "link", "delete", veth], capture_output=True)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        try:
            atexit.unregister(self.close)
            if signal.getsignal(signal.SIGTERM) == self._on_term:
                signal.signal(signal.SIGTERM, self._old_term)
        except Exception:
            pass


def leftovers(pid=None):
    """Names of this module's namespaces/links still present (for pid, or any)."""
    out = []
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    out += [l.split()[0] for l in r.stdout.splitlines() if l.split() and _NAME_RE.match(l.split()[0])]
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        parts = line.split(":")
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if _NAME_RE.match(name):
                out.append(name)
    if pid is not None:
        out = [x for x in out if _NAME_RE.match(x).group(1) == str(pid)]
    return out
