"""`brain mcp` as agents start it: a real subprocess over stdio, and streamable HTTP behind a bearer token."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from rag_app.engine import ConfigError
from tests.conftest import REPO, free_port
from tools.function_tools import MAX_REPLY_BYTES, TOOL_NAMES
from tools.mcp_server import check_token

BRAIN = str(Path(sys.executable).with_name("brain"))
QUIET = {"ANONYMIZED_TELEMETRY": "False"}
TOKEN = "test-token-0123456789abcdef"


def test_stdio_server_lists_the_tools_searches_reads_and_refuses_hostile_input(sample_home: Path):
    params = StdioServerParameters(command=BRAIN, args=["--home", str(sample_home), "mcp"], env=QUIET, cwd=REPO)

    async def session() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert sorted(tools) == sorted(TOOL_NAMES)
            assert tools["search_notes"].input_schema["properties"]["k"]["maximum"] == 20
            assert tools["get_note"].input_schema["required"] == ["note_id"]

            found = await mcp.call_tool("search_notes", {"query": "观影"})
            assert not found.is_error and "电影清单" in found.content[0].text
            note_id = json.loads(found.content[0].text)["results"][0]["note_id"]
            note = await mcp.call_tool("get_note", {"note_id": note_id})
            assert not note.is_error and "《千与千寻》" in json.loads(note.content[0].text)["text"]

            hostile = [("get_note", {"note_id": "../../etc/passwd"}, "a note id looks like"),
                       ("get_note", {"note_id": "/etc/passwd"}, "a note id looks like"),
                       ("get_note", {"note_id": "vault:../../etc/passwd"}, "cannot contain '..'"),
                       ("get_note", {"note_id": ""}, "at least 1 character"),
                       ("get_note", {"note_id": "vault:" + "x" * 10_000}, "at most 1024 characters"),
                       ("related_notes", {"note_id": 7}, "valid string"),
                       ("get_note", {}, "Field required"),
                       ("search_notes", {"query": "电影", "k": 10**9}, "less than or equal to 20"),
                       ("search_notes", {"queries": {"a": 1}}, "valid list"),
                       ("search_notes", {"query": "字" * 3_000_000}, "at most 2000 characters")]
            for name, arguments, message in hostile:
                refused = await mcp.call_tool(name, arguments)
                assert refused.is_error and message in refused.content[0].text, (name, refused.content[0].text)
                assert "Traceback" not in refused.content[0].text
                assert len(refused.content[0].text.encode()) < MAX_REPLY_BYTES

    anyio.run(session)


@pytest.mark.parametrize(("token", "message"), [
    ("", "needs a bearer token"), (" " * 20, "needs a bearer token"), ("\t\n" * 10, "needs a bearer token"),
    ("k3y-9", "at least 16 non-blank"), ("a b c d e f g h i j k l m n o", "at least 16 non-blank"),
    (" " + TOKEN, "leading or trailing"), (TOKEN + "\n", "leading or trailing"), ("令牌" * 10, "printable ASCII"),
    (TOKEN[:8] + "\x07" + TOKEN[8:], "printable ASCII"),
])
def test_weak_or_unsendable_tokens_are_refused(token: str, message: str):
    with pytest.raises(ConfigError, match=message) as refused:
        check_token(token)
    assert token.strip() == "" or token.strip() not in str(refused.value)


def test_a_token_of_sixteen_non_blank_characters_is_enough():
    assert check_token("0123456789abcdef") == "0123456789abcdef"
    assert check_token("a b c d e f g h i j k l m n o p") == "a b c d e f g h i j k l m n o p"


def test_http_needs_a_token_to_start_and_on_every_request(home: Path):
    env = {k: v for k, v in os.environ.items() if k != "BRAIN_MCP_TOKEN"} | QUIET
    for token in (None, "short", " " * 20):
        refused = subprocess.run([BRAIN, "--home", str(home), "mcp", "--http"], capture_output=True, text=True,
                                 env=env | ({"BRAIN_MCP_TOKEN": token} if token else {}), timeout=60)
        assert refused.returncode == 2 and "BRAIN_MCP_TOKEN" in refused.stderr

    port = free_port()
    server = subprocess.Popen([BRAIN, "--home", str(home), "mcp", "--http", "--port", str(port)],
                              env=env | {"BRAIN_MCP_TOKEN": TOKEN}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        _wait_for_port(port, server)
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
            assert httpx.post(url, json=hello, headers=headers).status_code == 401

        async def list_tools() -> list[str]:
            async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as client,
                        streamable_http_client(url, http_client=client) as (read, write),
                        ClientSession(read, write) as mcp):
                await mcp.initialize()
                return [t.name for t in (await mcp.list_tools()).tools]

        assert sorted(anyio.run(list_tools)) == sorted(TOOL_NAMES)
    finally:
        server.terminate()
        out, err = server.communicate(timeout=30)
    assert TOKEN not in out + err


def _wait_for_port(port: int, process: subprocess.Popen[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listening on port {port}")
