"""The brain as an MCP server: the tools of tools.function_tools, over stdio or bearer-guarded HTTP.

stdio is what Claude Code, Codex and other local agents start (`brain --home H mcp`). Streamable HTTP
(`brain mcp --http`) always needs a bearer token from BRAIN_MCP_TOKEN, because any local process or web page
could otherwise read the notes through it.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import re
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    CallToolResult,
    ErrorData,
    GetPromptResult,
    JSONRPCError,
    TextContent,
    ToolAnnotations,
)
from pydantic import ConfigDict, ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rag_app.engine import Brain, ConfigError
from tools.function_tools import CAPTURE_TOOL, BrainTools, ToolReply

__all__ = ["TOKEN_ENV", "BearerGuard", "build_server", "check_token", "run_http", "run_stdio"]

TOKEN_ENV = "BRAIN_MCP_TOKEN"
MIN_TOKEN_CHARS = 16
INSTRUCTIONS = (
    "Tools over the user's personal notes (Markdown vaults and Memos). Start with search_notes; open a hit with "
    "get_note, explore around it with related_notes; brain_status says what is indexed and how fresh it is. "
    "Answer from the notes and cite each one you use by title and path or url."
)
CAPTURE_INSTRUCTIONS = " capture_note saves a new note the user asked to keep; search_notes finds it at once."
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)


class BrainServer(MCPServer):
    """MCPServer over BrainTools. Asking for a prompt (there are none) is the client's mistake, answered as such (the
    SDK would log a 140-line traceback for it on stderr); a tool it does not know gets the tools' own refusal."""

    def __init__(self, tools: BrainTools, **settings: Any) -> None:
        self.brain_tools = tools
        super().__init__("cflow-brain", tools=[_mcp_tool(tools, name) for name in tools.tool_names()], **settings)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        """An unknown tool answers `{"error", "tool", "hint"}` with isError, like every other refusal (the SDK
        answers plain text)."""
        if self._tool_manager.get_tool(name) is None:
            return _result(await self.brain_tools.acall(name, arguments))
        return await super().call_tool(name, arguments, context)

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None,
                         context: Any = None) -> GetPromptResult:
        raise MCPError(INVALID_PARAMS, f"unknown prompt {name[:100]!r}: this server has no prompts")

    async def run_stdio_async(self) -> None:
        """As the SDK's, except that a line it cannot read is answered: the SDK drops it without a word (a lone
        surrogate, arguments nested too deep), and the agent waits for a reply forever. HTTP answers those with a 400
        parse error; here they get a JSON-RPC error carrying the request's id, and the connection goes on."""
        lowlevel = self._lowlevel_server
        async with stdio_server() as (read_stream, write_stream):
            readable, taken = anyio.create_memory_object_stream[SessionMessage | Exception](0)

            async def screen() -> None:
                async with readable, read_stream:
                    async for item in read_stream:
                        if not isinstance(item, Exception):
                            await readable.send(item)
                            continue
                        answer = unreadable_reply(item)
                        if answer is not None:
                            await write_stream.send(SessionMessage(answer))

            async with anyio.create_task_group() as group:
                group.start_soon(screen)
                await lowlevel.run(taken, write_stream, lowlevel.create_initialization_options())


log = logging.getLogger("cflow_brain.mcp")
_JSON_INTEGER = re.compile(r"-?\d+")


def unreadable_reply(problem: Exception) -> JSONRPCError | None:
    """The JSON-RPC error for a line the SDK could not read: invalid params (with the request's id) when the line is
    a request whose params cannot be read, invalid request when it is JSON of the wrong shape, a parse error (id
    null) when it is not JSON at all; None for a notification (JSON-RPC answers none)."""
    first = problem.errors(include_url=False)[0] if isinstance(problem, ValidationError) else None
    if first is None:
        log.warning("mcp: an unreadable message: %s", type(problem).__name__)
        return None
    given = first.get("input")
    if first["type"] != "json_invalid" or not isinstance(given, str):
        ident = given.get("id") if isinstance(given, dict) else None
        ident = ident if isinstance(ident, str | int) and not isinstance(ident, bool) else None
        return _error(ident, INVALID_REQUEST, "not a JSON-RPC 2.0 message (jsonrpc, id, method, params)")
    ident, is_request = _envelope(given)
    reason = str(first.get("msg", ""))
    log.warning("mcp: an unreadable line (%d characters): %s", len(given), reason[:200])
    if not is_request:
        return _error(None, PARSE_ERROR, f"parse error: {reason[:200]}") if ident is None else None
    if "surrogate" in reason or "hex escape" in reason:  # jiter: "lone leading surrogate", "unexpected end of ..."
        return _error(ident, INVALID_PARAMS, "invalid params: a string holds half of a UTF-16 surrogate pair "
                                             "(e.g. \\ud83c without its partner): send whole characters")
    if "recursion limit" in reason:
        return _error(ident, INVALID_PARAMS, "invalid params: nested too deep to read (at most about 200 levels)")
    return _error(ident, PARSE_ERROR, f"parse error: {reason[:200]}")


def _error(ident: str | int | None, code: int, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=ident, error=ErrorData(code=code, message=message))


def _envelope(line: str) -> tuple[str | int | None, bool]:
    """(the id, whether a method is named) read from the top level of a JSON object alone, whatever its params hold
    (the whole line may be too deep, or hold a lone surrogate, for a JSON parser): a reply can carry the id the agent
    waits on. A request is a line naming a method and an id."""
    text, at, depth = line.strip(), 0, 0
    key: str | None = None
    ident: str | int | None = None
    method = want_key = False
    while at < len(text):
        char = text[at]
        if char == '"':
            try:
                value, at = json.decoder.scanstring(text, at + 1)
            except ValueError:
                break
            if depth == 1 and want_key:
                key, want_key = value, False
            elif depth == 1:
                ident = value if key == "id" else ident
                method = method or key == "method"
            continue
        if char in "{[":
            depth += 1
            want_key = depth == 1 and char == "{"
        elif char in "}]":
            depth -= 1
        elif char == "," and depth == 1:
            want_key = True
        elif depth == 1 and key == "id" and not want_key and (number := _JSON_INTEGER.match(text, at)):
            ident, at = int(number.group()), number.end()
            continue
        at += 1
    return ident, method and ident is not None


class _AsSent(ArgModelBase):
    """The arguments exactly as the client sent them: tools.contract checks them (the same way as for LlamaIndex),
    so the SDK's own validation must let everything through."""

    model_config = ConfigDict(extra="allow")

    def model_dump_one_level(self) -> dict[str, Any]:
        return dict(self.__pydantic_extra__ or {})


def server_version() -> str:
    """cflow-brain's installed version, for `serverInfo.version`."""
    try:
        return package_version("cflow-brain")
    except PackageNotFoundError:
        return "0+unknown"


def build_server(home: Brain | str | os.PathLike[str] | None) -> MCPServer:
    """An MCP server over one brain (a Brain, e.g. the CLI's with its logging and store, or a home directory).

    capture_note is listed only when capture is enabled: with it off, no client can even see it."""
    tools = BrainTools(home if isinstance(home, Brain) else Brain(home))
    instructions = INSTRUCTIONS + (CAPTURE_INSTRUCTIONS if CAPTURE_TOOL in tools.tool_names() else "")
    return BrainServer(tools, version=server_version(), instructions=instructions, log_level="WARNING")


def _mcp_tool(tools: BrainTools, name: str) -> Tool:
    """The tool method's schema (unknown arguments refused in it too) over the shared call, which checks the
    arguments itself; refusals come back with isError set."""

    @functools.wraps(getattr(tools, name))
    async def call(**arguments: Any) -> CallToolResult:
        return _result(await tools.acall(name, arguments))

    tool = Tool.from_function(call, name=name, description=BrainTools.description(name),
                              annotations=WRITES if name == CAPTURE_TOOL else READ_ONLY, structured_output=False)
    tool.parameters["additionalProperties"] = False
    tool.fn_metadata = FuncMetadata(arg_model=_AsSent)
    return tool


def _result(reply: ToolReply) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=reply.text)], is_error=reply.is_error)


def run_stdio(home: Brain | str | os.PathLike[str] | None) -> None:
    """Serve on stdin/stdout until the client closes stdin (stdout carries only the protocol)."""
    build_server(home).run("stdio")


def run_http(home: Brain | str | os.PathLike[str] | None, host: str = "127.0.0.1", port: int = 8765,
             token: str | None = None) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp; every request needs `Authorization: Bearer <token>`.

    The token (else BRAIN_MCP_TOKEN) is mandatory on every host, loopback included, so a non-loopback host
    is never open. It is never logged or echoed.
    """
    import uvicorn

    token = check_token(token or os.environ.get(TOKEN_ENV) or "")
    server = build_server(home)
    app = BearerGuard(server.streamable_http_app(host=host), token)
    shown = f"[{host}]" if ":" in host else host
    print(f"brain mcp: serving http://{shown}:{port}/mcp (Authorization: Bearer ${TOKEN_ENV})", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def check_token(token: str) -> str:
    """A token guards every note: refuse one that is easy to guess (short, blank) or that no client could send
    (surrounding blanks are stripped from HTTP headers; control and non-ASCII characters are not sendable)."""
    hint = "e.g. `export BRAIN_MCP_TOKEN=$(openssl rand -hex 24)`"
    if not token.strip():
        raise ConfigError(f"MCP over HTTP needs a bearer token: set {TOKEN_ENV} ({hint})")
    if token != token.strip() or not (token.isascii() and token.isprintable()):
        raise ConfigError(f"{TOKEN_ENV} must be printable ASCII without leading or trailing blanks ({hint})")
    if len("".join(token.split())) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{TOKEN_ENV} is too short to guard your notes: use at least {MIN_TOKEN_CHARS} "
                          f"non-blank characters ({hint})")
    return token


class BearerGuard:
    """ASGI middleware: no request reaches MCP without the exact bearer token (compared in constant time)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or self._authorized(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            response = JSONResponse({"error": f"missing or wrong bearer token (see {TOKEN_ENV})"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
        else:
            await send({"type": "websocket.close", "code": 1008})

    def _authorized(self, scope: Scope) -> bool:
        """`Bearer <token>`, the scheme in any case (RFC 9110: schemes are case-insensitive), the token exact."""
        header = next((value for key, value in scope.get("headers", []) if key == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.lstrip(b" "), self._expected)

