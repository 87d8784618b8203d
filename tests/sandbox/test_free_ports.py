"""free_ports never hands out a port twice in one process: callers bind later, in a child."""

from modelserve_sandbox.processes import free_ports

# Enough one-port draws that the kernel's random pick repeats among them (birthday bound over the
# ephemeral range) unless free_ports remembers what it handed out.
DRAWS = 2_000


def test_one_port_at_a_time_never_repeats() -> None:
    ports = [port for _ in range(DRAWS) for port in free_ports(1)]
    assert len(set(ports)) == DRAWS


def test_ports_drawn_together_are_distinct_and_new() -> None:
    before = set(free_ports(3))
    together = free_ports(5)
    assert len(set(together)) == 5
    assert not before & set(together)
