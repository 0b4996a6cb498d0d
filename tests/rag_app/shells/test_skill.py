"""The cflow-brain Skill: it parses, it names only tools and arguments that exist, it installs where each agent
looks without clobbering an edited copy, and it ships in the wheel."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import anyio
import click
import pytest
import yaml
from click.testing import CliRunner

from rag_app.engine import Brain
from rag_app.shells.agent_skill import SKILL_NAME, skill_files
from rag_app.shells.cli import main
from tests.conftest import REPO
from tools.function_tools import CAPTURE_TOOL, TOOL_NAMES
from tools.mcp_server import build_server

CALL = re.compile(r"`(\w+)\(([^`]*)\)`")


def frontmatter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def tool_calls(text: str) -> list[tuple[str, list[str]]]:
    """Every `tool(arg, arg=value)` the text shows an agent, as (tool, argument names)."""
    calls = []
    for name, inside in CALL.findall(text):
        depth, part, parts = 0, "", []
        for char in inside + ",":
            depth += char in "[({" and 1 or (char in "])}" and -1 or 0)
            if char == "," and depth == 0:
                parts.append(part.strip())
                part = ""
            else:
                part += char
        calls.append((name, [p.split("=")[0].strip() for p in parts if p and p != "..."]))
    return calls


def test_the_frontmatter_parses_and_follows_the_skill_conventions():
    files = skill_files()
    assert set(files) == {"SKILL.md", "references/playbook.md", "agents/openai.yaml"}
    meta = frontmatter(files["SKILL.md"].decode())
    assert meta["name"] == SKILL_NAME and re.fullmatch(r"[a-z0-9-]{1,64}", meta["name"])
    assert 100 < len(meta["description"]) < 500 and "Use when" in meta["description"]  # catalogues cut at 500
    assert "references/playbook.md" in files["SKILL.md"].decode()
    interface = yaml.safe_load(files["agents/openai.yaml"])["interface"]
    assert interface["display_name"] and 25 <= len(interface["short_description"]) <= 64
    assert f"${SKILL_NAME}" in interface["default_prompt"]


def test_the_reference_validator_accepts_the_skill():
    """skills-ref, the Agent Skills reference library: name, description, fields as the format defines them."""
    from skills_ref import validate

    assert validate(REPO / "rag_app" / "shells" / "skill" / SKILL_NAME) == []


def test_the_skill_carries_the_packages_version_where_the_format_allows_extra_fields():
    """A consumer can pin the Skill and see it drift: `metadata.version` is cflow-brain's own version (the format
    allows no top-level `version`; see the README on `agentskills lint --strict`)."""
    meta = frontmatter(skill_files()["SKILL.md"].decode())
    assert meta["metadata"]["version"] == version("cflow-brain")


def test_every_tool_and_argument_the_skill_names_exists_in_the_mcp_server(home: Path, make_vault):
    vault = make_vault({"a.md": "# a\n"})
    (home / "config.toml").write_text(
        f'[embedding]\nmodel = "use-m3"\n\n[[sources]]\nname = "notes"\nkind = "vault"\npath = "{vault}"\n\n'
        '[capture]\nenabled = true\nsource = "notes"\n', encoding="utf-8")
    server = build_server(Brain(home))
    schemas = {t.name: t.input_schema["properties"] for t in anyio.run(server.list_tools)}
    assert set(schemas) == {*TOOL_NAMES, CAPTURE_TOOL}

    text = "\n".join(skill_files()[name].decode() for name in ("SKILL.md", "references/playbook.md"))
    calls = tool_calls(text)
    assert {name for name, _ in calls} == set(schemas), "the Skill shows every tool, and no other"
    for name, arguments in calls:
        assert set(arguments) <= set(schemas[name]), (name, arguments)
    for argument in ("queries", "k", "fresh", "title", "tags"):
        assert any(argument in arguments for _, arguments in calls), argument


def test_every_cli_example_in_the_skill_is_a_valid_brain_command():
    text = skill_files()["SKILL.md"].decode()
    examples = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()
                if line.startswith("brain ")]
    assert len(examples) >= 3
    for line in examples:
        args = shlex.split(line)[1:]
        with main.make_context("brain", list(args)) as ctx:
            name, command, rest = main.resolve_command(ctx, ctx._protected_args + ctx.args)
            assert isinstance(command, click.Command), line
            command.make_context(name, rest, parent=ctx)  # raises on an unknown option or a missing argument


@pytest.mark.parametrize(("target", "env", "folder"), [
    ("claude", {}, ".claude/skills"),
    ("codex", {}, ".codex/skills"),
    ("claude", {"CLAUDE_CONFIG_DIR": "claude-config"}, "claude-config/skills"),
    ("codex", {"CODEX_HOME": "codex-home"}, "codex-home/skills"),
])
def test_install_writes_the_skill_where_each_agent_looks(tmp_path: Path, monkeypatch, target, env, folder):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(tmp_path / value))
    result = CliRunner().invoke(main, ["skill", "install", "--target", target])
    assert result.exit_code == 0, result.output
    installed = tmp_path / folder / SKILL_NAME
    assert {p.relative_to(installed).as_posix() for p in installed.rglob("*") if p.is_file()} == set(skill_files())
    assert (installed / "SKILL.md").read_bytes() == skill_files()["SKILL.md"]
    again = CliRunner().invoke(main, ["skill", "install", "--target", target])
    assert again.exit_code == 0 and "already this version" in again.output


def test_install_refuses_to_overwrite_a_changed_copy_without_force(tmp_path: Path):
    skills = tmp_path / "project" / ".claude" / "skills"
    runner = CliRunner()
    assert runner.invoke(main, ["skill", "install", "--dir", str(skills)]).exit_code == 0
    edited = skills / SKILL_NAME / "SKILL.md"
    edited.write_text(edited.read_text(encoding="utf-8") + "\nMy own rule: answer in French.\n", encoding="utf-8")
    (skills / SKILL_NAME / "notes.txt").write_text("mine", encoding="utf-8")

    refused = runner.invoke(main, ["skill", "install", "--dir", str(skills)])
    assert refused.exit_code == 1 and "changed copy (SKILL.md)" in refused.output and "--force" in refused.output
    assert "My own rule" in edited.read_text(encoding="utf-8")

    forced = runner.invoke(main, ["skill", "install", "--dir", str(skills), "--force", "--json"])
    assert forced.exit_code == 0 and '"SKILL.md"' in forced.output
    assert edited.read_bytes() == skill_files()["SKILL.md"]
    assert (skills / SKILL_NAME / "notes.txt").read_text(encoding="utf-8") == "mine"


@pytest.mark.parametrize("blocker", ["agents", "SKILL.md"],
                         ids=["a-file-where-a-folder-goes", "a-folder-where-a-file-goes"])
def test_install_writes_nothing_when_any_target_is_in_the_way(tmp_path: Path, blocker: str):
    """Issue 22 item 9: `agents` as a file failed the install after SKILL.md had been written."""
    installed = tmp_path / "skills" / SKILL_NAME
    installed.mkdir(parents=True)
    if blocker == "SKILL.md":
        (installed / blocker).mkdir()
    else:
        (installed / blocker).write_text("mine", encoding="utf-8")

    refused = CliRunner().invoke(main, ["skill", "install", "--dir", str(tmp_path / "skills")])

    assert refused.exit_code == 1 and f"{installed / blocker}" in refused.output, refused.output
    assert "nothing was written" in refused.output
    assert sorted(p.relative_to(installed).as_posix() for p in installed.rglob("*")) == [blocker]


def test_skill_show_prints_skill_md():
    shown = CliRunner().invoke(main, ["skill", "show"])
    assert shown.exit_code == 0 and shown.output == skill_files()["SKILL.md"].decode()


def test_the_skill_ships_in_the_wheel(tmp_path: Path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("rag_app", "readers", "tools"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"rag_app/shells/skill/{SKILL_NAME}/{rel}" for rel in skill_files()} <= names
    modules = {str(path.relative_to(REPO)) for path in (REPO / "rag_app").rglob("*.py")}
    assert modules | {"rag_app/search/relevance_model.json"} <= names  # every layer folder and its data
