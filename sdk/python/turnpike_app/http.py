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


async def read_request(reader: asyncio.StreamReader) -> Optional[Request]:
    """The next request on the connection, or `None` at its end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
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
        raise BadRequest(f"not a request line: {lines[0]!r}")
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(f"not a header: {line!r}")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise BadRequest("a bad Content-Length")
        if length < 0 or length > MAX_BODY_BYTES:
            raise BadRequest("the body is too large")
        body = await reader.readexactly(length)
    return Request(method, path, headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            raise BadRequest("a bad chunk size")
        if size == 0:
            await reader.readuntil(b"\r\n")
            return bytes(body)
        if len(body) + size > MAX_BODY_BYTES:
            raise BadRequest("the body is too large")
        body += await reader.readexactly(size)
        await reader.readexactly(2)


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
