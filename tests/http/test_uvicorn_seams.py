"""The direct protocol (modelserve/http/direct.py) extends uvicorn's httptools protocol, private parts
included: each part it relies on must still be there, in the shape it relies on, in the installed
uvicorn. An upgrade of uvicorn that breaks one fails here, by name, before any proxy test."""

from __future__ import annotations

import inspect
import re

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from modelserve.http.direct import UVICORN_ATTRIBUTES, UVICORN_CALLS, UVICORN_OVERRIDES, DirectProtocol


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", UVICORN_OVERRIDES)
def test_each_method_the_protocol_overrides_is_uvicorns_with_the_same_parameters(name: str) -> None:
    assert name in vars(DirectProtocol), f"{name} is listed as overridden but is not"
    theirs = getattr(HttpToolsProtocol, name, None)
    assert callable(theirs), f"uvicorn's HttpToolsProtocol has no {name} any more"
    assert _parameters(vars(DirectProtocol)[name]) == _parameters(theirs)


@pytest.mark.parametrize("name", UVICORN_CALLS)
def test_each_method_the_protocol_calls_is_still_uvicorns(name: str) -> None:
    assert callable(getattr(HttpToolsProtocol, name, None)), f"uvicorn's HttpToolsProtocol has no {name} any more"


def _assigned(cls: type) -> set[str]:
    """The instance attributes a class's source sets (`self.name = ...`, annotated or not)."""
    return set(re.findall(r"self\.(\w+)\s*(?::[^=\n]*)?=", inspect.getsource(cls)))


def test_each_attribute_the_protocol_reads_is_still_set_by_uvicorn() -> None:
    assert set(UVICORN_ATTRIBUTES) - _assigned(HttpToolsProtocol) == set()


def test_the_lists_name_every_uvicorn_part_the_protocol_uses() -> None:
    """Every `self.<name>` in DirectProtocol that is uvicorn's (a method of its protocol, or an
    attribute its protocol sets) is in one of the lists: a new use of a private part cannot go
    unchecked."""
    theirs = set(dir(HttpToolsProtocol)) | _assigned(HttpToolsProtocol)
    ours = set(vars(DirectProtocol)) - set(UVICORN_OVERRIDES)
    used = set(re.findall(r"self\.(\w+)", inspect.getsource(DirectProtocol)))
    listed = set(UVICORN_OVERRIDES) | set(UVICORN_CALLS) | set(UVICORN_ATTRIBUTES)
    assert (used & theirs) - ours - listed == set()


def test_the_servers_tls_startup_uses_what_uvicorns_server_still_has() -> None:
    """serve.py's `Server.startup` makes the listening servers itself under TLS (a handshake
    deadline, a worker's unix socket in plain HTTP): it relies on uvicorn's startup given no socket
    running the lifespan and listening on nothing, on its Server keeping the listening servers in
    `servers` (closed at shutdown), its `server_state` and `lifespan.state`, and on the protocol
    being made from those three; and on uvicorn's Config taking the context from a factory."""
    import uvicorn
    from uvicorn.lifespan.on import LifespanOn

    assert {"servers", "server_state", "lifespan", "config", "started"} <= _assigned(uvicorn.Server)
    assert "state" in _assigned(LifespanOn)
    startup = inspect.getsource(uvicorn.Server.startup)
    assert re.search(r"if sockets is not None:.*?for sock in sockets:", startup, re.DOTALL)
    assert startup.index("await self.lifespan.startup()") < startup.index("if sockets is not None")
    assert "for server in self.servers" in inspect.getsource(uvicorn.Server.shutdown)
    assert _parameters(HttpToolsProtocol.__init__)[1:4] == ["config", "server_state", "app_state"]
    assert "ssl_context_factory" in _parameters(uvicorn.Config.__init__)
