"""Reading a request's body in the gateway: the chunks of an ASGI request, and the whole
JSON body under a size limit (`agentrl.gateway.server`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import ClientDisconnect

from agentrl.gateway.protocol import GatewayError, bad


async def receive_body(receive: Any) -> AsyncIterator[bytes]:
    """The chunks of an ASGI request's body (Starlette's `Request.stream`).

    Raises:
        ClientDisconnect: the client went away before the body's end.
    """
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                return
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


async def read_body(chunks: AsyncIterator[bytes], limit: int) -> tuple[Any, int]:
    """A request's JSON body and its size in bytes, read whole (so the client gets the answer).

    Raises:
        GatewayError: 413 over `limit` bytes, 400 for a body that is not JSON.
    """
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size <= limit:
            parts.append(chunk)
    if size > limit:
        raise GatewayError(413, f"the request body has {size} bytes; the limit is {limit}",
                           code="request_too_large")
    try:
        return json.loads(parts[0] if len(parts) == 1 else b"".join(parts)), size
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"the request body is not valid JSON: {e}") from None
