"""One argument and error contract on every way in: the same bad call gets the same refusal, byte for byte, over MCP
stdio, MCP streamable HTTP and LlamaIndex FunctionTools, always `{"error", "tool", "hint"}` flagged as an error."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import Field

from rag_app.engine import Brain
from tests.conftest import REPO, free_port
from tests.tools.test_mcp_server import QUIET, TOKEN, wait_for_port
from tools.contract import ToolCallError, check_arguments, params, usage
from tools.function_tools import BrainTools, brain_tools

BRAIN = str(Path(sys.executable).with_name("brain"))

BAD_CALLS: list[tuple[str, dict, str]] = [
    ("search_notes", {"query": 5}, "query must be a string of at most 2000 characters, got 5"),
    ("search_notes", {"query": "电影", "k": 2.5}, "k must be an integer from 1 to 20, got 2.5"),
    ("search_notes", {"query": "电影", "k": True}, "k must be an integer from 1 to 20, got true"),
    ("search_notes", {"query": "电影", "k": "5"}, "k must be an integer from 1 to 20, got a string of 1 characters"),
    ("search_notes", {"query": "电影", "k": 0}, "k must be an integer from 1 to 20, got 0"),
    ("search_notes", {"query": "电影", "k": 10**9}, "k must be an integer from 1 to 20, got 1000000000"),
    ("search_notes", {"query": "电影", "bogus": 1}, "unknown argument(s): bogus"),
    ("search_notes", {}, "query is required: a string of at most 2000 characters"),
    ("search_notes", {"queries": ["电影"]}, "query is required"),
    ("search_notes", {"query": "  "}, "query is empty"),
    ("search_notes", {"query": "电影", "queries": "电影"}, "queries must be a list of at most 11 strings"),
    ("search_notes", {"query": "电影", "queries": {"a": 1}}, "queries must be a list of at most 11 strings (each at "
                                                            "most 2000 characters), got an object"),
    ("search_notes", {"query": "电影", "queries": ["x"] * 13}, "got a list of 13 items"),
    ("search_notes", {"query": "电影", "queries": ["电影", 7]}, "each of queries must be a string of at most 2000 "
                                                               "characters, got 7"),
    ("search_notes", {"query": None}, "query must be a string of at most 2000 characters, got null"),
    ("search_notes", {"query": "rust", "k": None}, "k must be an integer from 1 to 20, got null"),
    ("search_notes", {"query": "电影", "detail": None}, "detail must be 'brief' or 'passages', got null"),
    ("search_notes", {"query": "字" * 5_000}, "got a string of 5000 characters"),
    ("search_notes", {"query": "电影", "since": "last week"}, "date like 2024-03-15"),
    ("search_notes", {"query": "电影", "source": "nowhere"}, "unknown source 'nowhere'"),
    ("search_notes", {"query": "电影", "detail": "full"}, "detail must be 'brief' or 'passages', got 'full'"),
    ("get_note", {}, "note_id is required: a string of 1 to 1024 characters"),
    ("get_note", {"note_id": None}, "note_id must be a string of 1 to 1024 characters, got null"),
    ("get_note", {"note_id": "vault:notes/plan.md", "fresh": None}, "fresh must be true or false, got null"),
    ("get_note", {"note_id": 42}, "note_id must be a string of 1 to 1024 characters, got 42"),
    ("get_note", {"note_id": ""}, "got a string of 0 characters"),
    ("get_note", {"note_id": "   "}, "note_id is empty"),
    ("get_note", {"note_id": "vault:" + "x" * 10_000}, "got a string of 10006 characters"),
    ("get_note", {"note_id": "../../etc/passwd"}, "a note id looks like"),
    ("get_note", {"note_id": "vault:../../etc/passwd"}, "cannot contain '..'"),
    ("get_note", {"note_id": "vault:notes/missing.md"}, "no note with id 'vault:notes/missing.md'"),
    ("get_note", {"note_id": "vault:notes/plan.md", "fresh": "yes"}, "fresh must be true or false"),
    ("related_notes", {"note_id": ["vault:notes/plan.md"]}, "got a list of 1 items"),
    ("brain_status", {"verbose": True}, "unknown argument(s): verbose"),
]


@pytest.fixture
def small_home(home: Path, make_vault) -> Path:
    vault = make_vault({"plan.md": "# 发布计划\n先做灰度发布。\n", "movies.md": "# 电影清单\n《千与千寻》\n"})
    (home / "config.toml").write_text(
        f'[embedding]\nmodel = "use-m3"\n\n[[sources]]\nname = "notes"\nkind = "vault"\npath = "{vault}"\n',
        encoding="utf-8")
    assert not Brain(home).sync().failed
    return home


async def _replies_over(session: ClientSession) -> list[tuple[bool, str]]:
    await session.initialize()
    replies = []
    for name, arguments, _ in BAD_CALLS:
        result = await session.call_tool(name, arguments)
        replies.append((result.is_error, result.content[0].text))
    return replies


def _stdio_replies(home: Path) -> list[tuple[bool, str]]:
    params_ = StdioServerParameters(command=BRAIN, args=["--home", str(home), "mcp"], env=QUIET, cwd=REPO)

    async def run() -> list[tuple[bool, str]]:
        async with stdio_client(params_) as (read, write), ClientSession(read, write) as session:
            return await _replies_over(session)

    return anyio.run(run)


def _http_replies(home: Path) -> list[tuple[bool, str]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "BRAIN_MCP_TOKEN"} | QUIET | {"BRAIN_MCP_TOKEN": TOKEN}
    server = subprocess.Popen([BRAIN, "--home", str(home), "mcp", "--http", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    async def run() -> list[tuple[bool, str]]:
        async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as client,
                    streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client) as (read, write),
                    ClientSession(read, write) as session):
            return await _replies_over(session)

    try:
        wait_for_port(port, server)
        return anyio.run(run)
    finally:
        server.terminate()
        server.communicate(timeout=30)


def _function_tool_replies(home: Path) -> list[tuple[bool, str]]:
    tools = {tool.metadata.name: tool for tool in brain_tools(Brain(home))}
    replies = []
    for name, arguments, _ in BAD_CALLS:
        output = tools[name].call(**arguments)
        replies.append((output.is_error, output.content))
    return replies


def test_every_bad_call_gets_the_same_refusal_over_mcp_stdio_mcp_http_and_function_tools(small_home: Path):
    paths = {"mcp stdio": _stdio_replies(small_home), "mcp http": _http_replies(small_home),
             "function tools": _function_tool_replies(small_home)}
    for (name, arguments, message), *replies in zip(BAD_CALLS, *paths.values(), strict=True):
        assert len({text for _, text in replies}) == 1, (name, arguments, replies)
        assert all(is_error for is_error, _ in replies), (name, arguments)
        reply = json.loads(replies[0][1])
        assert set(reply) == {"error", "tool", "hint"} and reply["tool"] == name, reply
        assert message in reply["error"], (name, reply["error"])
        assert "Traceback" not in reply["error"] and len(replies[0][1]) < 600


def test_argument_errors_hint_at_the_tools_arguments_and_other_errors_at_the_fix(small_home: Path):
    tools = BrainTools(Brain(small_home))
    refused = json.loads(tools.call("get_note", {}).text)
    assert refused["hint"] == "get_note takes note_id (required), fresh (default false)"
    missing = json.loads(tools.call("get_note", {"note_id": "vault:notes/missing.md"}).text)
    assert "search_notes" in missing["hint"] and "file path" in missing["hint"]
    unknown = json.loads(tools.call("delete_everything", {}).text)
    assert unknown == {"error": "unknown tool", "tool": "delete_everything",
                       "hint": "the tools are search_notes, get_note, related_notes, brain_status"}


def test_a_missing_argument_is_a_clear_error_on_the_async_path_too_and_logs_nothing(small_home: Path, capfd):
    tool = {t.metadata.name: t for t in brain_tools(Brain(small_home))}["get_note"]
    output = anyio.run(tool.acall)
    assert output.is_error and json.loads(output.content)["error"].startswith("note_id is required")
    assert "Traceback" not in capfd.readouterr().err


def test_good_calls_are_not_errors_on_either_path(small_home: Path):
    tools = {t.metadata.name: t for t in brain_tools(Brain(small_home))}
    found = tools["search_notes"].call(query="电影", k=5.0)  # an integral number is an integer, as JSON Schema says
    assert not found.is_error and json.loads(found.content)["results"][0]["title"] == "电影清单"
    listed = tools["search_notes"].call(query="灰度", queries='["release plan"]')  # a list sent as JSON text
    assert not listed.is_error and json.loads(listed.content)["coverage"]["queries"][:2] == ["灰度", "release plan"]
    unfiltered = tools["search_notes"].call(query="电影", source=None, queries=None)  # null where the schema admits it
    assert not unfiltered.is_error and json.loads(unfiltered.content)["results"][0]["title"] == "电影清单"


def test_python_callers_may_pass_arguments_by_position_and_get_the_error_shape_when_they_overdo_it(small_home: Path):
    tools = {t.metadata.name: t for t in brain_tools(Brain(small_home))}
    found = tools["search_notes"].call("电影", None, 3)
    assert not found.is_error and json.loads(found.content)["results"][0]["title"] == "电影清单"
    assert not anyio.run(tools["get_note"].acall, "vault:notes/plan.md").is_error
    for output, message in [(tools["get_note"].call("vault:notes/plan.md", False, "x"),
                             "at most 2 positional argument(s), got 3"),
                            (tools["get_note"].call("vault:notes/plan.md", note_id="vault:notes/movies.md"),
                             "note_id given twice: by position and by name")]:
        reply = json.loads(output.content)
        assert output.is_error and reply == {"error": message, "tool": "get_note",
                                             "hint": "get_note takes note_id (required), fresh (default false)"}


@pytest.mark.parametrize("arguments", [{"query": "\ud83c movie"}, {"query": "movie", "queries": ["\udfac 电影"]},
                                       {"query": "movie", "tag": "a\ud800"}])
def test_half_a_character_is_bad_input_not_an_index_failure(small_home: Path, arguments: dict):
    """A JS agent that cuts 🎬 in half sends a lone surrogate: the agent is told to fix its text."""
    output = {t.metadata.name: t for t in brain_tools(Brain(small_home))}["search_notes"].call(**arguments)
    reply = json.loads(output.content)
    assert output.is_error and "not valid text" in reply["error"] and "lone surrogate" in reply["error"], reply


def sample_tool(
    text: Annotated[str, Field(min_length=1, max_length=10)],
    n: Annotated[int, Field(ge=1, le=3)] = 2,
    words: Annotated[list[Annotated[str, Field(max_length=4)]] | None, Field(max_length=2)] = None,
    mode: Annotated[Literal["a", "b"], Field()] = "a",
    flag: bool = False,
    labels: list[str] | None = None,
) -> None:
    """A tool signature of every kind the contract reads."""


def test_the_contract_is_read_from_the_annotations_that_make_the_schema():
    declared = {p.name: p for p in params(sample_tool)}
    assert declared["text"].required and declared["text"].expects() == "a string of 1 to 10 characters"
    assert declared["n"].expects() == "an integer from 1 to 3" and declared["n"].default == 2
    assert declared["words"].expects() == "a list of at most 2 strings (each at most 4 characters)"
    assert declared["mode"].expects() == "'a' or 'b'" and declared["flag"].expects() == "true or false"
    assert usage(sample_tool) == ('sample_tool takes text (required), n (default 2), words, mode (default "a"), '
                                  "flag (default false), labels")
    assert check_arguments(sample_tool, {"text": "x", "n": 3.0, "words": ["ab"], "mode": "b", "flag": True}) == {
        "text": "x", "n": 3, "words": ["ab"], "mode": "b", "flag": True}
    assert check_arguments(sample_tool, {"text": "x", "words": None}) == {"text": "x"}  # `| None`: null is absent
    assert not declared["n"].nullable and declared["words"].nullable
    for arguments, message in [({"text": "x", "words": ["abcde"]}, "each of words"),
                               ({"text": "x", "words": ["a", "b", "c"]}, "got a list of 3 items"),
                               ({"text": "x", "flag": 1}, "flag must be true or false, got 1"),
                               ({"text": "x", "flag": None}, "flag must be true or false, got null"),
                               ({"text": "x", "labels": [1, 2]}, "each of labels must be a string, got 1"),
                               ({"text": "x", "n": None}, "n must be an integer from 1 to 3, got null"),
                               ({"text": "x", "mode": None}, "mode must be 'a' or 'b', got null"),
                               ({"text": "x", "n": 1e300}, "got 1e+300"),
                               ({"text": "x", "n": 10**30}, "got a 31-digit number"),
                               ([1, 2], "arguments must be an object, not a list of 2 items")]:
        with pytest.raises(ToolCallError, match=re.escape(message)):
            check_arguments(sample_tool, arguments)
