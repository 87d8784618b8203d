"""What the real node changes on the host, recorded before it starts and put back after it stops.

The kubelet sets kernel sysctls, the CNI bridge plugin turns on IP forwarding, kube-proxy and
the CNI plugins add iptables chains and rules, containerd and the kubelet mount overlays,
network namespaces and volumes, and the kubelet makes the `kubepods` cgroups. The record is
kept in a file so that a run killed before it could clean up is cleaned up by the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Every sysctl the kubelet, kube-proxy or the CNI plugins may write on a node like ours.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.ipv6.conf.all.forwarding",
)
IPTABLES = ("iptables", "ip6tables")
# The nftables family behind each command (iptables-nft keeps its tables as nftables tables).
NFT_FAMILY = {"iptables": "ip", "ip6tables": "ip6"}
CGROUP_ROOT = Path("/sys/fs/cgroup")
SHIM_SOCKETS = Path("/run/containerd/s")  # containerd 1.6 puts every shim's socket here
KUBEPODS = "kubepods"


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        try:
            values[name] = _sysctl_path(name).read_text().strip()
        except OSError:
            continue  # not on this kernel (e.g. br_netfilter not loaded yet)
    return values


def iptables_save(command: str) -> str | None:
    """The rules as `iptables-save` prints them ("" when no table exists yet), None if it fails."""
    try:
        result = subprocess.run([f"{command}-save"], capture_output=True, text=True)
    except OSError:
        return None
    return result.stdout if result.returncode == 0 else None


@dataclass(frozen=True)
class TableDiff:
    """What appeared in one iptables table between two `iptables-save` outputs."""

    table: str
    chains: tuple[str, ...]  # user chains that did not exist before
    rules: tuple[str, ...]  # `-A CHAIN ...` lines that were not there before


BUILTIN_CHAINS = frozenset({"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"})


def parse_saved(saved: str) -> dict[str, tuple[set[str], Counter[str]]]:
    """Pure: `iptables-save` output as table -> (its chains, its `-A` rule lines counted)."""
    tables: dict[str, tuple[set[str], Counter[str]]] = {}
    current = None
    for line in saved.splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:], (set(), Counter()))
        elif current is not None and line.startswith(":"):
            current[0].add(line[1:].split()[0])
        elif current is not None and line.startswith("-A "):
            current[1][line] += 1
    return tables


def iptables_additions(before: str, after: str) -> list[TableDiff]:
    """Pure: the chains and rules `after` has that `before` had not, table by table."""
    old, new = parse_saved(before), parse_saved(after)
    diffs = []
    for table, (chains, rules) in new.items():
        old_chains, old_rules = old.get(table, (set(), Counter()))
        added_rules = rules - old_rules
        added_chains = sorted(chains - old_chains)
        if added_rules or added_chains:
            diffs.append(TableDiff(table, tuple(added_chains), tuple(added_rules.elements())))
    return diffs


def emptied_new_tables(before: str, after: str) -> list[str]:
    """Pure: the tables `after` has that `before` had not, now holding no rule and no chain of
    their own (only the built-in ones): the kubelet and kube-proxy made them on a host that had
    none, and they are ours to remove."""
    old = parse_saved(before)
    return [
        table
        for table, (chains, rules) in parse_saved(after).items()
        if table not in old and not rules and chains <= BUILTIN_CHAINS
    ]


def _undo_iptables(command: str, before: str) -> None:
    for diff in iptables_additions(before, iptables_save(command) or ""):
        base = [command, "-w", "5", "-t", diff.table]
        # Rules in chains that stay go first (they may jump to chains about to go), then
        # the new chains are emptied and removed.
        for rule in diff.rules:
            chain, *spec = shlex.split(rule)[1:]
            if chain not in diff.chains:
                subprocess.run([*base, "-D", chain, *spec], capture_output=True)
        for chain in diff.chains:
            subprocess.run([*base, "-F", chain], capture_output=True)
        for chain in diff.chains:
            subprocess.run([*base, "-X", chain], capture_output=True)
    # A table that was not there before goes too, once empty: iptables cannot remove a table, nft
    # can (iptables-nft's tables are nftables tables; nftables is one of the node's packages).
    for table in emptied_new_tables(before, iptables_save(command) or ""):
        subprocess.run(["nft", "delete", "table", NFT_FAMILY[command], table], capture_output=True)


def mounts_under(*roots: Path) -> list[Path]:
    """Mount points below any of `roots`, deepest first (the order to unmount them in)."""
    prefixes = [str(root.resolve()) for root in roots]
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            found.append(Path(point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def unmount_all(*roots: Path) -> None:
    for _ in range(3):  # a lazy unmount may reveal a mount that was below it
        points = mounts_under(*roots)
        if not points:
            return
        for point in points:
            if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(point)], capture_output=True)


def kubepods_cgroups() -> list[Path]:
    return [d / KUBEPODS for d in sorted(CGROUP_ROOT.iterdir()) if (d / KUBEPODS).is_dir()]


def kill_cgroup_processes(cgroups: list[Path], timeout: float = 15.0) -> None:
    """SIGKILL every process in these cgroup trees (containers whose shims are gone keep running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = {int(pid) for root in cgroups for procs in _procs_files(root) for pid in _read_lines(procs)}
        pids.discard(os.getpid())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _procs_files(root: Path) -> list[Path]:
    """Every cgroup.procs below `root`; os.walk skips a cgroup removed while it walks (rglob raised)."""
    return [Path(directory) / "cgroup.procs" for directory, _, files in os.walk(root) if "cgroup.procs" in files]


def remove_cgroup_tree(root: Path) -> None:
    for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        _rmdir(directory)
    _rmdir(root)


def _rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _listing(directory: Path) -> list[str]:
    try:
        return sorted(p.name for p in directory.iterdir())
    except OSError:
        return []


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


@dataclass
class HostState:
    """The host as it was before the real node started, and where the node keeps its state."""

    pid: int
    node_dirs: list[str]
    bridge: str
    sysctls: dict[str, str] = field(default_factory=dict)
    iptables: dict[str, str | None] = field(default_factory=dict)
    kubepods_existed: bool = False
    shim_sockets: list[str] = field(default_factory=list)  # containerd's, in SHIM_SOCKETS

    @classmethod
    def record(cls, node_dirs: list[Path], bridge: str) -> HostState:
        return cls(
            pid=os.getpid(),
            node_dirs=[str(d) for d in node_dirs],
            bridge=bridge,
            sysctls=read_sysctls(),
            iptables={command: iptables_save(command) for command in IPTABLES},
            kubepods_existed=bool(kubepods_cgroups()),
            shim_sockets=_listing(SHIM_SOCKETS),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> HostState | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def restore(self) -> None:
        """Put the host back; every step is safe to repeat and to run after a crash."""
        dirs = [Path(d) for d in self.node_dirs]
        if not self.kubepods_existed:
            kill_cgroup_processes(kubepods_cgroups())
        unmount_all(*dirs)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        for command, before in self.iptables.items():
            if before is not None:
                _undo_iptables(command, before)
        # Shims remove their sockets when they exit cleanly, not when they are killed.
        for name in set(_listing(SHIM_SOCKETS)) - set(self.shim_sockets):
            (SHIM_SOCKETS / name).unlink(missing_ok=True)
        for name, value in self.sysctls.items():
            path = _sysctl_path(name)
            try:
                if path.read_text().strip() != value:
                    path.write_text(value)
            except OSError:
                pass
        if not self.kubepods_existed:
            for root in kubepods_cgroups():
                remove_cgroup_tree(root)
