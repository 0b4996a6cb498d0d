"""`brain mcp` as agents start it: a real subprocess over stdio, and streamable HTTP behind a bearer token."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from rag_app.engine import Brain, ConfigError, validate_note_id
from tests.conftest import REPO, free_port, stop
from tests.doubles.memos_server import MemosDouble
from tools.function_tools import CAPTURE_TOOL, TOOL_NAMES, BrainTools
from tools.mcp_server import build_server, check_token

BRAIN = str(Path(sys.executable).with_name("brain"))
# An MCP client starts its server with a minimal environment: PYTHONPATH passes on, so a checkout's tests run its code
QUIET = {"ANONYMIZED_TELEMETRY": "False"} | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}
TOKEN = "test-token-0123456789abcdef"
MEMOS_TOKEN = "memos_pat_test"


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
            answered = json.loads((await mcp.call_tool("search_notes", {"query": "我想看哪些电影"})).content[0].text)
            assert answered["not_found"] is False and answered["results"][0]["strength"] == "strong"
            nothing = json.loads((await mcp.call_tool("search_notes", {"query": "xylophonegiraffe"})).content[0].text)
            assert nothing["not_found"] is True and {r["strength"] for r in nothing["results"]} == {"weak"}

            hostile = [("get_note", {"note_id": "../../etc/passwd"}, "a note id looks like"),
                       ("get_note", {"note_id": "/etc/passwd"}, "a note id looks like"),
                       ("get_note", {"note_id": "vault:../../etc/passwd"}, "cannot contain '..'"),
                       ("search_notes", {"query": "字" * 3_000_000}, "at most 2000 characters")]
            for name, arguments, message in hostile:
                refused = await mcp.call_tool(name, arguments)
                assert refused.is_error and message in json.loads(refused.content[0].text)["error"], name
                assert len(refused.content[0].text.encode()) < 1_000

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
        wait_for_port(port, server)
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN},
                        {"Authorization": f"Basic {TOKEN}"}, {"Authorization": f"Bearer{TOKEN}"},
                        {"Authorization": f"bearer {TOKEN[:-1]}"}, {"Authorization": f"Bearer {TOKEN}x"}):
            assert httpx.post(url, json=hello, headers=headers).status_code == 401, headers

        async def list_tools(scheme: str) -> list[str]:
            async with (httpx2.AsyncClient(headers={"Authorization": f"{scheme} {TOKEN}"}) as client,
                        streamable_http_client(url, http_client=client) as (read, write),
                        ClientSession(read, write) as mcp):
                await mcp.initialize()
                return [t.name for t in (await mcp.list_tools()).tools]

        for scheme in ("Bearer", "bearer", "BEARER"):  # schemes are case-insensitive (RFC 9110 §11.1)
            assert sorted(anyio.run(list_tools, scheme)) == sorted(TOOL_NAMES), scheme
    finally:
        server.terminate()
        out, err = server.communicate(timeout=30)
    assert TOKEN not in out + err


def wait_for_port(port: int, process: subprocess.Popen[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listening on port {port}")


def test_the_server_names_its_version_and_an_unknown_prompt_or_tool_is_a_clean_error(home: Path, tmp_path: Path):
    errors = tmp_path / "stderr.txt"

    async def session() -> None:
        with errors.open("w") as errlog:
            async with stdio_client(_stdio(home), errlog=errlog) as (read, write), ClientSession(read, write) as mcp:
                hello = await mcp.initialize()
                assert hello.server_info.name == "cflow-brain"
                assert hello.server_info.version == version("cflow-brain")
                assert (await mcp.list_prompts()).prompts == []
                with pytest.raises(MCPError, match="unknown prompt 'no-such-prompt'"):
                    await mcp.get_prompt("no-such-prompt")
                assert not (await mcp.call_tool("brain_status", {})).is_error  # the server goes on
                unknown = await mcp.call_tool("nope", {"query": "rust"})
                assert unknown.is_error and json.loads(unknown.content[0].text) == {
                    "error": "unknown tool", "tool": "nope",
                    "hint": "the tools are search_notes, get_note, related_notes, brain_status"}

    anyio.run(session)
    assert "Traceback" not in errors.read_text(encoding="utf-8")


def test_every_schema_refuses_unknown_arguments_and_its_note_id_examples_are_real_ids(home: Path):
    schemas = [t.input_schema for t in anyio.run(build_server(Brain(home)).list_tools)]
    assert all(schema["additionalProperties"] is False for schema in schemas)
    text = json.dumps(schemas, ensure_ascii=False)
    examples = re.findall(r"'((?:vault|memos):[^']+)'", text)
    assert len(examples) >= 2 and all(validate_note_id(example) == example for example in examples)
    assert "memos:<uid>" not in text
    detail = next(s for s in schemas if "detail" in s["properties"])["properties"]["detail"]
    assert detail["enum"] == ["brief", "passages"] and detail["default"] == "brief"


def test_search_notes_says_query_is_required_in_a_schema_every_client_takes(home: Path):
    """`required` names query; no schema puts anyOf/oneOf/allOf (or a conditional) at its root, which the Anthropic API
    refuses for the whole request and Claude Code drops silently, and none uses $ref (refused anywhere there)."""
    schemas = {t.name: t.input_schema for t in anyio.run(build_server(Brain(home)).list_tools)}
    assert schemas["search_notes"]["required"] == ["query"]
    assert schemas["search_notes"]["properties"]["query"]["type"] == "string"
    for name, schema in schemas.items():
        assert schema["type"] == "object", name
        assert not {"anyOf", "oneOf", "allOf", "not", "if", "then", "else"} & set(schema), name
        assert "$ref" not in json.dumps(schema) and "$defs" not in schema, name
        for argument, declared in schema["properties"].items():  # null only where null means absent
            if argument in ("k", "detail", "fresh", "note_id", "query", "text"):
                assert "null" not in json.dumps(declared), (name, argument)


@pytest.mark.skipif(shutil.which("npx") is None, reason="the MCP Inspector runs through npx")
@pytest.mark.parametrize(("given", "arguments"), [("k=2.5", {"query": "x", "k": 2.5}),
                                                  ("bogus=1", {"query": "x", "bogus": 1})])
def test_the_mcp_inspector_cli_gets_the_projects_refusal(home: Path, given: str, arguments: dict):
    """A client nobody here wrote: the official Inspector's CLI gets the refusal BrainTools gives directly."""
    inspector = [shutil.which("npx"), "-y", "@modelcontextprotocol/inspector", "--cli", BRAIN, "--home", str(home),
                 "mcp", "--method", "tools/call", "--tool-name", "search_notes", "--tool-arg", "query=x",
                 "--tool-arg", given]
    ran = subprocess.run(inspector, capture_output=True, text=True, timeout=240, cwd=REPO,
                         env=os.environ | QUIET | {"npm_config_update_notifier": "false"})
    if ran.returncode != 0 and "npm error" in ran.stderr:
        pytest.skip("the Inspector could not be fetched from the npm registry")
    reply = json.loads(ran.stdout)
    expected = BrainTools(Brain(home)).call("search_notes", arguments)
    assert reply["isError"] is True and expected.is_error
    assert reply["content"] == [{"type": "text", "text": expected.text}]


@pytest.mark.skipif(shutil.which("npx") is None, reason="the MCP Inspector runs through npx")
def test_the_mcp_inspector_in_strict_mode_finds_no_schema_problem_and_reads_query_as_required(home: Path):
    """Inspector 2.12 (on the TypeScript SDK, whose schemas parse tools/list): --strict exits 6 on a portability error
    and prints every finding; a `null` it makes of an unparsable value is refused like any wrong type."""
    inspector = [shutil.which("npx"), "-y", "@modelcontextprotocol/inspector@2.12.0", "--cli",
                 *(["-e", f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []),
                 BRAIN, "--home", str(home), "mcp"]
    env = os.environ | QUIET | {"npm_config_update_notifier": "false"}
    listed = subprocess.run([*inspector, "--method", "tools/list", "--strict"], capture_output=True, text=True,
                            timeout=300, cwd=REPO, env=env)
    if listed.returncode != 0 and "npm error" in listed.stderr:
        pytest.skip("the Inspector could not be fetched from the npm registry")
    findings = [line for line in listed.stderr.splitlines() if not line.startswith("npm ")]
    assert listed.returncode == 0 and findings == [], listed.stderr
    schemas = {t["name"]: t["inputSchema"] for t in json.loads(listed.stdout)["tools"]}
    assert schemas["search_notes"]["required"] == ["query"]
    called = subprocess.run([*inspector, "--method", "tools/call", "--tool-name", "search_notes", "--tool-arg",
                             "query=rust", "--tool-arg", "k=ten"], capture_output=True, text=True, timeout=300,
                            cwd=REPO, env=env)
    reply = json.loads(called.stdout)
    assert reply["isError"] is True and "k must be an integer from 1 to 20, got null" in reply["content"][0]["text"]


def _stdio(home: Path, env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=BRAIN, args=["--home", str(home), "mcp"], env=QUIET | (env or {}), cwd=REPO)


def _configure(home: Path, source: str, extra: str = "") -> None:
    (home / "config.toml").write_text(f'[embedding]\nmodel = "use-m3"\n\n[[sources]]\n{source}\n{extra}',
                                      encoding="utf-8")


def test_stdio_capture_is_absent_by_default_then_saves_into_the_vault_inbox_and_fresh_reads_see_edits(
        home: Path, make_vault):
    vault = make_vault({"plan.md": "# 发布计划\n先做灰度发布。\n"})
    _configure(home, f'name = "notes"\nkind = "vault"\npath = "{vault}"')
    assert not Brain(home).sync().failed

    async def without_capture() -> None:
        async with stdio_client(_stdio(home)) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            assert sorted(t.name for t in (await mcp.list_tools()).tools) == sorted(TOOL_NAMES)
            refused = await mcp.call_tool(CAPTURE_TOOL, {"text": "should not be saved"})
            assert refused.is_error

    anyio.run(without_capture)
    assert sorted(p.name for p in vault.iterdir()) == ["plan.md"]

    _configure(home, f'name = "notes"\nkind = "vault"\npath = "{vault}"',
               '\n[capture]\nenabled = true\nsource = "notes"\nfolder = "Inbox"\n')

    async def with_capture() -> None:
        async with stdio_client(_stdio(home)) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert sorted(tools) == sorted((*TOOL_NAMES, CAPTURE_TOOL))
            assert tools[CAPTURE_TOOL].annotations.read_only_hint is False
            assert tools[CAPTURE_TOOL].input_schema["required"] == ["text"]

            saved = await mcp.call_tool(CAPTURE_TOOL, {"text": "回滚方案：保留旧库只读两周。", "title": "回滚方案",
                                                       "tags": ["work"]})
            assert not saved.is_error, saved.content[0].text
            note_id = json.loads(saved.content[0].text)["note_id"]
            found = json.loads((await mcp.call_tool("search_notes", {"query": "回滚 旧库 只读"})).content[0].text)
            assert found["results"][0]["note_id"] == note_id and found["results"][0]["strength"] == "strong"

            (vault / "plan.md").write_text("# 发布计划\n改为一次性全量发布。\n", encoding="utf-8")
            indexed = json.loads((await mcp.call_tool("get_note", {"note_id": "vault:notes/plan.md"})).content[0].text)
            fresh = json.loads((await mcp.call_tool("get_note", {"note_id": "vault:notes/plan.md", "fresh": True}))
                               .content[0].text)
            assert "先做灰度发布" in indexed["text"] and "stale" not in indexed
            assert fresh["stale"] is True and "一次性全量发布" in fresh["text"]
            hostile = await mcp.call_tool("get_note", {"note_id": "vault:notes/../../etc/passwd", "fresh": True})
            assert hostile.is_error and "cannot contain '..'" in hostile.content[0].text

    anyio.run(with_capture)
    (captured,) = (vault / "Inbox").iterdir()
    assert "回滚方案：保留旧库只读两周。" in captured.read_text(encoding="utf-8")


def test_stdio_capture_into_memos_makes_a_private_memo_found_in_the_same_session(home: Path, monkeypatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", MEMOS_TOKEN)
    with MemosDouble(mode="head", token=MEMOS_TOKEN) as double:
        double.add_memo("Weekly review: finish the reading list #review", visibility="PUBLIC")
        _configure(home, f'name = "cflow"\nkind = "memos"\nurl = "{double.url}"',
                   '\n[capture]\nenabled = true\nsource = "cflow"\n\n[mcp]\nallow_private = true\n')
        assert not Brain(home).sync().failed

        async def session() -> None:
            async with (stdio_client(_stdio(home, {"CFLOW_API_TOKEN": MEMOS_TOKEN})) as (read, write),
                        ClientSession(read, write) as mcp):
                await mcp.initialize()
                saved = await mcp.call_tool(CAPTURE_TOOL, {"text": "读书清单加上《置身事内》。", "tags": ["读书"]})
                assert not saved.is_error, saved.content[0].text
                reply = json.loads(saved.content[0].text)
                assert reply["visibility"] == "PRIVATE" and reply["note_id"].startswith("memos:cflow/")
                found = json.loads((await mcp.call_tool("search_notes", {"query": "置身事内"})).content[0].text)
                assert found["results"][0]["note_id"] == reply["note_id"]

                uid = reply["note_id"].rsplit("/", 1)[1]
                double.edit_memo(uid, "读书清单加上《置身事内》和《债务危机》。#读书")
                fresh = json.loads((await mcp.call_tool("get_note", {"note_id": reply["note_id"], "fresh": True}))
                                   .content[0].text)
                assert fresh["stale"] is True and "债务危机" in fresh["text"]

        anyio.run(session)
        (created,) = [r for r in double.requests if r["method"] == "POST" and r["path"] == "/api/v1/memos"]
        assert created["status"] == 200 and double.memo_json(uid_of(double))["visibility"] == "PRIVATE"


def uid_of(double: MemosDouble) -> str:
    """The memo the capture made: the double's newest."""
    return max(double._uids, key=double._uids.__getitem__)


def test_stdio_answers_a_lone_surrogate_and_deep_arguments_with_an_error_and_goes_on(home: Path):
    """A JS agent that cuts 🎬 in half sends "\\ud83c movie"; a hostile one nests `arguments` 200 or 3,000 deep. Each
    gets a JSON-RPC error with its id (before: no reply at all, the agent waiting forever), and the next call on the
    same connection is answered."""
    server = subprocess.Popen([BRAIN, "--home", str(home), "mcp"], cwd=REPO, env=os.environ | QUIET,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def send(line: str) -> None:
        assert server.stdin is not None
        server.stdin.write(line + "\n")
        server.stdin.flush()

    def reply() -> dict:
        assert server.stdout is not None
        line = server.stdout.readline()  # bounded by the watchdog below: a silent server fails it
        assert line, server.stderr.read() if server.stderr else ""
        return json.loads(line)

    def call(n: int, arguments: str) -> str:
        return (f'{{"jsonrpc": "2.0", "id": {n}, "method": "tools/call", "params": {{"name": "search_notes", '
                f'"arguments": {arguments}}}}}')

    watchdog = threading.Timer(120, server.kill)  # a server that never answers is killed, not waited on forever
    watchdog.start()
    try:
        send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}))
        assert reply()["id"] == 0
        send('{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        send(call(1, '{"query": "\\ud83c movie"}'))
        send(call(2, '{"query": ' + "[" * 200 + "]" * 200 + "}"))
        send(call(3, '{"query": ' + "[" * 3000 + "]" * 3000 + "}"))
        send('{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "brain_status", "arguments": {}')
        send("not json")
        send(call(5, '{"query": "movie"}'))
        replies = [reply() for _ in range(6)]
    finally:
        watchdog.cancel()
        stop(server)
    errors = {r["id"]: r["error"] for r in replies if "error" in r}
    assert sorted(errors, key=str) == [1, 2, 3, 4, None], replies
    assert {errors[n]["code"] for n in (1, 2, 3)} == {-32602}  # invalid params, naming what is wrong
    assert "surrogate" in errors[1]["message"] and "deep" in errors[2]["message"] == errors[3]["message"]
    assert errors[4]["code"] == errors[None]["code"] == -32700  # a cut line, not JSON at all: parse errors
    answered = next(r for r in replies if r.get("id") == 5)
    assert answered["result"]["isError"] is False
