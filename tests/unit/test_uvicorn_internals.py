"""server/transport.py subclasses uvicorn's httptools protocol and relies on some of its
private members; an upgrade that drops or renames one must fail here, by name, and not
as a stalled connection under load."""

from __future__ import annotations

import inspect
import re
from importlib.metadata import version

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from tradeoff.server.transport import UVICORN_ATTRIBUTES, UVICORN_METHODS


def test_every_method_the_transport_overrides_is_still_uvicorns() -> None:
    missing = [name for name in UVICORN_METHODS if not callable(
        getattr(HttpToolsProtocol, name, None))]
    assert not missing, (f"uvicorn {version('uvicorn')} has no HttpToolsProtocol."
                         f"{', '.join(missing)}: server/transport.py overrides them; check "
                         "it against this uvicorn before widening the pin in pyproject.toml")
    start = inspect.signature(HttpToolsProtocol._start_asgi_task)
    assert list(start.parameters) == ["self", "cycle", "app"], start


def test_every_attribute_the_transport_reads_is_still_set_by_uvicorn() -> None:
    source = inspect.getsource(HttpToolsProtocol)
    assigned = set(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=(?!=)", source))
    missing = [name for name in UVICORN_ATTRIBUTES if name not in assigned]
    assert not missing, (f"uvicorn {version('uvicorn')}'s HttpToolsProtocol no longer sets "
                         f"{', '.join(missing)}: server/transport.py reads them; check it "
                         "against this uvicorn before widening the pin in pyproject.toml")
    assert "response_complete" in inspect.getsource(RequestResponseCycle)
