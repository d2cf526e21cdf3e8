"""A small HTTP/1.1 server side on asyncio streams: just what the protocol needs."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024

REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
           404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large"}


class BadRequest(Exception):
    pass


@dataclass
class Request:
    method: str
    path: str
    headers: Dict[str, str]
    body: bytes


#: The longest a connection may sit idle before its next request (a pooled connection of the
#: worker is reused within this).
IDLE_SECONDS = 120.0
#: The longest a request's headers and body may take to arrive once started.
READ_SECONDS = 30.0


async def read_head(reader: asyncio.StreamReader) -> Optional[Request]:
    """The next request's line and headers (its body not read), or `None` at the
    connection's end or after it sat idle too long."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_SECONDS)
    except asyncio.TimeoutError:
        return None
    except asyncio.IncompleteReadError as e:
        if e.partial.strip():
            raise BadRequest("the request ended inside its headers")
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest("the request's headers are too long")
    if len(head) > MAX_HEADER_BYTES:
        raise BadRequest("the request's headers are too long")
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, path, _version = lines[0].split(" ", 2)
    except ValueError:
        raise BadRequest(f"not a request line: {lines[0][:80]!r}")
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(f"not a header: {line[:80]!r}")
        name = name.strip().lower()
        if name in headers and name in ("content-length", "transfer-encoding"):
            raise BadRequest(f"{name} given twice")
        headers[name] = value.strip()
    return Request(method, path, headers, b"")


async def read_body(reader: asyncio.StreamReader, request: Request, limit: int = MAX_BODY_BYTES) -> None:
    """Reads the request's body (at most `limit` bytes) into it."""
    encoding = request.headers.get("transfer-encoding")
    if encoding is not None:
        if encoding.lower() != "chunked":
            raise BadRequest(f"transfer-encoding {encoding!r} is not supported")
        if "content-length" in request.headers:
            raise BadRequest("both content-length and transfer-encoding")
        request.body = await asyncio.wait_for(_read_chunked(reader, limit), READ_SECONDS)
        return
    raw = request.headers.get("content-length", "0")
    if not raw.isdigit():
        raise BadRequest("a bad Content-Length")
    length = int(raw)
    if length > limit:
        raise BadRequest("the body is too large")
    request.body = await asyncio.wait_for(reader.readexactly(length), READ_SECONDS)


async def _read_chunked(reader: asyncio.StreamReader, limit: int) -> bytes:
    body = bytearray()
    try:
        while True:
            size_line = (await reader.readuntil(b"\r\n"))[:-2].split(b";")[0].strip()
            if not size_line or any(c not in b"0123456789abcdefABCDEF" for c in size_line):
                raise BadRequest("a bad chunk size")
            size = int(size_line, 16)
            if size == 0:
                # Trailers, if any, up to the empty line.
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                return bytes(body)
            if len(body) + size > limit:
                raise BadRequest("the body is too large")
            body += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise BadRequest("a chunk without its CRLF")
    except asyncio.LimitOverrunError:
        raise BadRequest("a chunk line is too long")


async def respond(writer: asyncio.StreamWriter, status: int, body: Any, close: bool = False) -> None:
    """A whole response; `body` is sent as JSON (`None`: no body)."""
    data = b"" if body is None else json.dumps(body).encode()
    head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    if body is not None:
        head.append("Content-Type: application/json")
    head.append(f"Content-Length: {len(data)}")
    if close:
        head.append("Connection: close")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    await writer.drain()


class ChunkedWriter:
    """A streamed response: the head, chunks as they come, the end."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer

    async def start(self, headers: Dict[str, str]) -> None:
        head = ["HTTP/1.1 200 OK", "Transfer-Encoding: chunked", "Connection: close"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await self.writer.drain()

    async def write(self, data: bytes) -> None:
        self.writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await self.writer.drain()

    async def finish(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()
