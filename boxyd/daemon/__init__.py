"""The daemon's side of boxy.

asyncio is imported here first, without its TLS support: boxyd speaks no TLS, and
asyncio's optional import of ssl maps OpenSSL's libssl and libcrypto into the daemon
(1.2 MiB of its resident memory, about 9 ms of its start; issue #18's 40 MB). Each of
asyncio's modules then holds ``ssl = None`` and refuses TLS; a later ``import ssl``
elsewhere works as usual. A process that imported asyncio already keeps its TLS.
"""

import sys

if "asyncio" not in sys.modules and "ssl" not in sys.modules:
    sys.modules["ssl"] = None  # type: ignore[assignment]  # what ImportError looks like
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]
