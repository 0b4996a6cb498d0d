"""The warm engine: `brain watch` (and serve, mcp) answers the CLI's everyday commands on a socket inside the home,
exactly as the command would answer in-process; faults (a killed server, a stale socket, someone else's socket, two
clients at once) never cost an answer."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rag_app.answers.sessions import SessionStore
from rag_app.config import CONFIG_FILE, ConfigError, load_settings
from rag_app.engine import MAX_QUERIES, Brain
from rag_app.shells import cli, warm_engine
from tests.conftest import REPO, as_an_ordinary_user, stop
from tests.doubles.embeddings_server import EmbeddingsDouble
from tests.doubles.openai_server import OpenAIDouble

BRAIN = str(Path(sys.executable).with_name("brain"))
LOST = "stopped answering"


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that changes an answer (LLM, tokens, home), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(warm_engine.ENV_PREFIXES)}
    return env | {"ANONYMIZED_TELEMETRY": "False"} | extra


def brain(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`brain` as a user types it (the installed entry point, which tries the warm engine first)."""
    return subprocess.run([BRAIN, "--home", str(home), *args], capture_output=True, text=True, cwd=REPO,
                          env=env or clean_env(), timeout=300)


def served(home: Path) -> list[str]:
    """The commands the home's warm engine has answered, from brain.log."""
    log = home / "brain.log"
    text = log.read_text(encoding="utf-8") if log.exists() else ""
    return [line.split("`")[1] for line in text.splitlines() if "warm engine: `" in line]


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s")


def start_watch(home: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """`brain watch` for the home, returned once its warm engine answers and has loaded the models."""
    process = subprocess.Popen([BRAIN, "--home", str(home), "watch"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)

    def warm() -> bool:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        status = brain(home, "status", "--json", env=env)
        return status.returncode == 0 and json.loads(status.stdout)["engine"]["mode"] == "warm"

    wait_for(warm, 120)
    wait_for(lambda: "warm engine: warmed up" in (home / "brain.log").read_text(encoding="utf-8").split("serving")[-1],
             120)
    return process


@pytest.fixture(scope="module")
def warm_home(tmp_path_factory: pytest.TempPathFactory, sample_home: Path) -> Iterator[Path]:
    """A copy of the synced sample home, served warm by a `brain watch` for the module's tests."""
    home = tmp_path_factory.mktemp("warm") / "home"
    shutil.copytree(sample_home, home, ignore=shutil.ignore_patterns("warm"))
    process = start_watch(home, clean_env())
    yield home
    stop(process)


FOLLOW_UPS = [tuple(line.split(" → ")) for line in """
手冲咖啡水温多少度 → 那研磨度呢？
我想看哪些电影？ → 第二部是谁导演的？
京都去了哪些寺庙 → 要多少钱
成都三日吃了什么 → 第二天去了哪里
我家猫多重 → 它每天吃多少
番茄炒蛋怎么做 → 要放糖吗
rust borrow checker rules → what about lifetimes?
how do I undo the last git commit → and the remote branch?
跑步配速 → 那心率呢
出门旅行要带什么 → 证件呢
三体里的黑暗森林 → 作者是谁
日语学习方法 → 每天学多久
家里的路由器怎么设置 → 这个型号是什么
docker 怎么删除停止的容器 → 镜像呢？
每个月存多少钱 → 那基金呢
""".strip().splitlines()]
NEW_TOPICS = [tuple(line.split(" → ")) for line in """
手冲咖啡水温多少度 → 番茄要选什么样的
我想看哪些电影？ → 番茄炒蛋怎么做
京都去了哪些寺庙 → 我家猫多重
成都三日吃了什么 → how do I undo the last git commit
跑步配速 → 家里的路由器怎么设置
rust borrow checker rules → 日语学习方法
三体里的黑暗森林 → 支付超时事故的根因是什么
我家猫多重 → how to limit API request rate
番茄炒蛋怎么做 → 跑步配速
出门旅行要带什么 → 每个月存多少钱
docker 怎么删除停止的容器 → 植物怎么浇水
日语学习方法 → 京都去了哪些寺庙
how to limit API request rate → 三体里的黑暗森林
which of my plants are hard to kill → 手冲咖啡水温多少度
家里的路由器怎么设置 → rust borrow checker rules
""".strip().splitlines()]


def test_a_conversation_searches_a_new_topic_as_asked_and_gives_a_follow_up_its_subject(warm_home: Path):
    """30 two-turn conversations through `brain ask --session` (no LLM): every new topic is searched bare, and at
    least 90 % of follow-ups (pronouns, 呢, ordinals, or elliptical: 要多少钱, 作者是谁) are given the last subject."""

    def second_turn(n: int, first: str, second: str) -> str:
        session = f"pair-{n}"
        assert brain(warm_home, "ask", first, "--session", session, "--json").returncode == 0
        done = brain(warm_home, "ask", second, "--session", session, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["coverage"]["condensed_query"]

    new = {second: second_turn(n, first, second) for n, (first, second) in enumerate(NEW_TOPICS)}
    assert {q: c for q, c in new.items() if c != q} == {}
    given = [second_turn(100 + n, first, second) != second for n, (first, second) in enumerate(FOLLOW_UPS)]
    assert sum(given) >= 0.9 * len(FOLLOW_UPS), [q for (_, q), ok in zip(FOLLOW_UPS, given, strict=True) if not ok]


# ------------------------------------------------------------------------------------------------ the same answers


ANSWERED_THE_SAME = [
    ["search", "观影", "--json"],
    ["search", "how do I deploy the service"],
    ["search", "跑步", "--since", "not-a-date"],
    ["search", "咖啡", "--mode", "bm25", "-k", "3", "--tag", "nope"],
    ["ask", "番茄炒蛋怎么做", "--json"],
    ["ask", "潜水艇驾驶执照"],
    ["get", "vault:sample_vault/index.md"],
    ["get", "vault:sample_vault/no-such-note.md", "--json"],
    ["get", "../etc/passwd"],
    ["sessions", "--json"],
    ["search", "x", "--no-such-option"],
]


def test_warm_commands_answer_exactly_as_in_process(warm_home: Path, monkeypatch: pytest.MonkeyPatch):
    for name in [k for k in os.environ if k.startswith(warm_engine.ENV_PREFIXES)]:
        monkeypatch.delenv(name)
    before = len(served(warm_home))
    for args in ANSWERED_THE_SAME:
        warm = brain(warm_home, *args)
        here = CliRunner().invoke(cli.main, ["--home", str(warm_home), "--no-daemon", *args], prog_name="brain")
        assert (warm.returncode, warm.stdout, warm.stderr) == (here.exit_code, here.stdout, here.stderr), args
    assert served(warm_home)[before:] == [args[0] for args in ANSWERED_THE_SAME]


def test_status_says_which_way_the_command_ran(warm_home: Path):
    pid = int(json.loads(brain(warm_home, "status", "--json").stdout)["engine"]["pid"])
    assert pid != os.getpid()
    warm = brain(warm_home, "status")
    assert f"engine: warm (brain watch, pid {pid})" in warm.stdout.splitlines()
    here = brain(warm_home, "--no-daemon", "status")
    assert "engine: in-process" in here.stdout.splitlines()
    assert json.loads(brain(warm_home, "--no-daemon", "status", "--json").stdout)["engine"] == {"mode": "in-process"}
    env_forced = brain(warm_home, "status", "--json", env=clean_env(BRAIN_NO_DAEMON="1"))
    assert json.loads(env_forced.stdout)["engine"] == {"mode": "in-process"}
    assert [line for line in warm.stdout.splitlines() if not line.startswith("engine:")] == \
        [line for line in here.stdout.splitlines() if not line.startswith("engine:")]


def test_a_different_environment_runs_in_process_and_status_names_the_variables(warm_home: Path):
    """An LLM configured only in the caller's environment would change the answer: the caller's own process runs it,
    and `status` says why, naming the variables that differ and never their values (issue 29: a `brain watch` from
    a systemd unit without LLM_MODEL was silently never used)."""
    pid = json.loads(brain(warm_home, "status", "--json").stdout)["engine"]["pid"]
    before = len(served(warm_home))
    done = brain(warm_home, "status", "--json", env=clean_env(LLM_MODEL="qwen2.5", LLM_API_KEY="sk-secret-4711"))
    why = f"the warm engine (brain watch, pid {pid}) runs with another environment: LLM_API_KEY, LLM_MODEL differ"
    assert json.loads(done.stdout)["engine"] == {"mode": "in-process", "why": why}
    text = brain(warm_home, "status", env=clean_env(LLM_MODEL="qwen2.5"))
    assert f"engine: in-process — the warm engine (brain watch, pid {pid}) runs with another environment: LLM_MODEL " \
           "differs" in text.stdout.splitlines()
    assert "qwen2.5" not in done.stdout + text.stdout and "sk-secret" not in done.stdout
    assert (done.stderr, text.stderr) == ("", "")  # said by status only: other commands answer as in-process
    assert len(served(warm_home)) == before


def test_two_clis_at_once_each_get_their_own_answer(warm_home: Path):
    queries = ["观影", "how do I deploy the service", "跑步", "番茄炒蛋"]
    alone = {q: brain(warm_home, "search", q, "--json").stdout for q in queries}
    before = len(served(warm_home))
    for _ in range(3):
        running = {q: subprocess.Popen([BRAIN, "--home", str(warm_home), "search", q, "--json"], cwd=REPO,
                                       env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for q in queries}
        for query, process in running.items():
            out, err = process.communicate(timeout=120)
            assert (process.returncode, err, out) == (0, "", alone[query])
    assert len(served(warm_home)) == before + 3 * len(queries)


def test_the_warm_engine_sees_what_the_watcher_synced(tmp_path: Path):
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "a.md").write_text("# Alpha\n\nthe first note about gardening\n", encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\nsecond_model = ""\n', encoding="utf-8")
    env = clean_env()
    assert brain(home, "sync", "--vault", str(vault), env=env).returncode == 0
    process = start_watch(home, env)
    try:
        written = tmp_path / "b.md"  # saved whole, as editors do: a watcher never lists it empty (titled "b")
        written.write_text("# Beta\n\nzanzibarite mineral samples\n", encoding="utf-8")
        written.replace(vault / "b.md")
        wait_for(lambda: "+1 ~0 -0 =1" in (home / "brain.log").read_text(encoding="utf-8"), 60)
        found = json.loads(brain(home, "search", "zanzibarite", "--json", env=env).stdout)["results"]
        assert [r["title"] for r in found][:1] == ["Beta"], found
        assert served(home)[-1] == "search"
    finally:
        stop(process)


# ------------------------------------------------------------------------------------------------ faults


def tea_home(tmp_path: Path) -> tuple[Path, Path]:
    """A one-note vault and a fast-model home whose LLM is not retried: the faults below kill the engine mid-answer."""
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "tea.md").write_text("# Tea\n\nGreen tea is brewed at 80 degrees for two minutes.\n", encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\nsecond_model = ""\n'
                                      '[llm]\nmax_retries = 0\n', encoding="utf-8")
    return vault, home


def test_a_warm_engine_killed_mid_request_falls_back_and_says_so_once(tmp_path: Path):
    vault, home = tea_home(tmp_path)
    asked, release = threading.Event(), threading.Event()

    def first_waits(body: dict) -> str:
        if not asked.is_set():
            asked.set()
            release.wait(60)
        return "Brew green tea at 80 degrees [1]."

    with OpenAIDouble([first_waits]) as double:
        env = clean_env(LLM_BASE_URL=double.url, LLM_MODEL="qwen2.5", LLM_API_KEY="sk-test-0123456789")
        assert brain(home, "sync", "--vault", str(vault), env=env).returncode == 0
        server = start_watch(home, env)
        try:
            client = subprocess.Popen([BRAIN, "--home", str(home), "ask", "how hot should green tea be brewed"],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert asked.wait(120), "the warm engine never asked the LLM"
            assert served(home) == ["status"] * len(served(home))  # the ask is in hand, not yet answered
            server.send_signal(signal.SIGKILL)
            server.wait(30)
            release.set()
            out, err = client.communicate(timeout=300)
        finally:
            release.set()
            stop(server)
        assert client.returncode == 0, err
        assert "Brew green tea at 80 degrees [1]." in out
        assert out.count("Brew green tea") == 1
        assert err.count(LOST) == 1 and err.splitlines()[0].startswith("brain: the warm engine of ")

        # the killed server left its socket behind: the next command runs here, silently, as in-process
        assert warm_engine.socket_path(home).is_socket()
        again = brain(home, "status", "--json", env=env)
        assert (again.returncode, again.stderr, json.loads(again.stdout)["engine"]) == (0, "", {"mode": "in-process"})


def test_a_warm_engine_killed_after_storing_the_turn_leaves_it_stored_once(tmp_path: Path):
    """The engine stores the session's turn, then dies before the client has its answer: the ask run again in the
    client's process answers with that turn and does not store it twice."""
    vault, home = tea_home(tmp_path)
    asked, release = threading.Event(), threading.Event()
    # far more than a socket's send buffer holds: the engine is still writing it when it is killed, its turn stored
    buffer = int(Path("/proc/sys/net/core/wmem_default").read_text())
    sentence = "Brew green tea at 80 degrees [1]. "
    repeats = max(20_000, 4 * buffer // len(sentence))
    answer = sentence * repeats

    def first_waits(body: dict) -> str:
        if not asked.is_set():
            asked.set()
            release.wait(60)
        return answer

    with OpenAIDouble([first_waits]) as double:
        env = clean_env(LLM_BASE_URL=double.url, LLM_MODEL="qwen2.5", LLM_API_KEY="sk-test-0123456789")
        assert brain(home, "sync", "--vault", str(vault), env=env).returncode == 0
        server = start_watch(home, env)
        store = SessionStore(home / "sessions.sqlite")
        try:
            client = subprocess.Popen([BRAIN, "--home", str(home), "ask", "how hot should green tea be brewed",
                                       "--session", "tea"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            assert asked.wait(120), "the warm engine never asked the LLM"
            client.send_signal(signal.SIGSTOP)  # reads nothing more: the engine's answer fills the socket
            release.set()
            wait_for(lambda: len(store.turns("tea")) == 1, 60)
            server.send_signal(signal.SIGKILL)
            server.wait(30)
            client.send_signal(signal.SIGCONT)
            out, err = client.communicate(timeout=300)
        finally:
            release.set()
            stop(server)
        requests = len(double.requests)
    assert client.returncode == 0, err
    assert err.count(LOST) == 1
    assert [turn["answer"].count("Brew green tea") for turn in store.turns("tea")] == [repeats], "stored once"
    assert out.count("Brew green tea") == repeats, "the answer printed once"
    assert requests == 1, "the stored turn answered the ask run again"


def test_a_socket_with_no_server_is_ignored_and_the_next_server_replaces_it(tmp_path: Path):
    home = tmp_path / "home"
    stale = stale_socket(home)
    request = warm_engine.WarmRequest(home, "", ["status"])
    assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) is None
    with warm_engine.serving(Brain(home), "test", printing_run, "") as engine:
        assert stale.is_socket() and engine.served_by["server"] == "test"
        out, err = io.StringIO(), io.StringIO()
        assert warm_engine.ask_warm(request, out, err) == 7
        assert (out.getvalue(), err.getvalue()) == ("ran --home status\n", "on stderr\n")
    assert not stale.exists()  # a server that stops takes its socket with it


def stale_socket(home: Path) -> Path:
    """A socket file as a killed server leaves it: bound, nobody listening."""
    folder = home / warm_engine.SOCKET_DIR
    folder.mkdir(parents=True, mode=0o700)
    path = folder / warm_engine.SOCKET_NAME
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
    return path


def printing_run(argv: list[str]) -> int:
    """A command for the engine to run: writes to both streams as a CLI command does, exit code 7."""
    print("ran", argv[0], argv[-1])
    print("on stderr", file=sys.stderr)
    return 7


def test_one_server_per_home(tmp_path: Path):
    home = tmp_path / "home"
    with warm_engine.serving(Brain(home), "first", printing_run, ""):
        second = warm_engine.WarmEngine(Brain(home), "second", printing_run, "")
        assert second.start() == "another process serves this home's engine"
        second.stop()
        out = io.StringIO()
        assert warm_engine.ask_warm(warm_engine.WarmRequest(home, "", ["get", "x"]), out, io.StringIO()) == 7
    mode = os.stat(home / warm_engine.SOCKET_DIR).st_mode & 0o777
    assert mode == 0o700


def test_concurrent_clients_never_see_each_others_output(tmp_path: Path):
    home = tmp_path / "home"
    together = threading.Barrier(4, timeout=30)

    def chatty(argv: list[str]) -> int:
        together.wait()  # all four commands run at the same time
        for _ in range(200):
            print(argv[-1])
        return int(argv[-1])

    results: dict[int, tuple[int | None, str]] = {}

    def client(n: int) -> None:
        out = io.StringIO()
        code = warm_engine.ask_warm(warm_engine.WarmRequest(home, "", ["search", str(n)]), out, io.StringIO())
        results[n] = (code, out.getvalue())

    with warm_engine.serving(Brain(home), "test", chatty, ""):
        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert results == {n: (n, f"{n}\n" * 200) for n in range(4)}


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a socket to another user takes root (CI runs as root)")
def test_a_socket_owned_by_another_user_is_never_used(tmp_path: Path):
    home = tmp_path / "home"
    (home / warm_engine.SOCKET_DIR).mkdir(parents=True, mode=0o700)
    path = warm_engine.socket_path(home)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(4)
        listener.settimeout(0.3)
        os.chmod(path, 0o666)  # anyone could connect: only the owner check stands in the way
        os.chown(path, 65534, 65534)
        request = warm_engine.WarmRequest(home, "", ["status"])
        with as_an_ordinary_user():
            assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) is None
        with pytest.raises(TimeoutError):
            listener.accept()
        os.chown(path, os.geteuid(), os.getegid())  # the same socket, ours: the client does connect
        lost: list[Exception] = []

        def ask() -> None:
            try:
                warm_engine.ask_warm(request, io.StringIO(), io.StringIO())
            except warm_engine.WarmEngineLost as exc:
                lost.append(exc)

        with as_an_ordinary_user():
            client = threading.Thread(target=ask, daemon=True)
            client.start()
            conn, _ = listener.accept()
            conn.close()
            client.join(10)
        assert len(lost) == 1  # it connected, and was told nothing


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user takes root (CI runs as root)")
def test_a_server_never_serves_from_another_users_socket_folder(tmp_path: Path):
    home = tmp_path / "home"
    stale = stale_socket(home)
    brain = Brain(home)  # opened first: a home holding another user's folder is refused (rag_app.index.private)
    os.chown(stale.parent, 65534, 65534)
    with pytest.raises(ConfigError, match=f"^{stale.parent} belongs to uid 65534"):
        Brain(home)
    engine = warm_engine.WarmEngine(brain, "test", printing_run, "")
    assert engine.start() == f"{stale.parent} is not a folder of this user's"
    engine.stop()
    assert stale.is_socket()  # left alone: not ours to remove


def test_a_socket_folder_others_may_enter_is_never_used(tmp_path: Path):
    home = tmp_path / "home"
    with warm_engine.serving(Brain(home), "test", printing_run, ""):
        request = warm_engine.WarmRequest(home, "", ["status"])
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) == 7
        os.chmod(home / warm_engine.SOCKET_DIR, 0o755)
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) is None


def test_a_request_for_another_home_store_or_environment_is_refused(tmp_path: Path, monkeypatch):
    home = tmp_path / "home"
    with warm_engine.serving(Brain(home), "test", printing_run, "http://127.0.0.1:8000"):
        path = warm_engine.socket_path(home)
        assert warm_engine.ask_warm(warm_engine.WarmRequest(home, "", ["status"]), io.StringIO(),
                                    io.StringIO()) is None
        assert warm_engine.ask_warm(warm_engine.WarmRequest(home, "http://127.0.0.1:8000", ["status"]),
                                    io.StringIO(), io.StringIO()) == 7
        monkeypatch.setenv("LLM_MODEL", "another")
        assert warm_engine.ask_warm(warm_engine.WarmRequest(home, "http://127.0.0.1:8000", ["status"]),
                                    io.StringIO(), io.StringIO()) is None
        assert path.is_socket()


def test_a_changed_config_runs_in_process(tmp_path: Path):
    """The server runs on the config.toml it loaded at start: once the file changes (or goes, or comes) a client runs
    in its own process, where the new config applies; the same content again is served again."""
    home = tmp_path / "home"
    home.mkdir()
    config = home / CONFIG_FILE
    config.write_text('[embedding]\nmodel = "use-m3"\n', encoding="utf-8")
    request = warm_engine.WarmRequest(home, "", ["status"])
    with warm_engine.serving(Brain(home), "test", printing_run, ""):
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) == 7
        config.write_text('[embedding]\nmodel = "use-m3"\n[llm]\nmodel = "qwen2.5"\n', encoding="utf-8")
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) is None
        assert hand_made(home, ["status"])[0]["refused"] == f"loaded {home.absolute() / CONFIG_FILE} before it changed"
        config.unlink()
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) is None
        config.write_text('[embedding]\nmodel = "use-m3"\n', encoding="utf-8")
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) == 7
    other = tmp_path / "other"
    with warm_engine.serving(Brain(other), "test", printing_run, ""):  # no config.toml when it started
        request = warm_engine.WarmRequest(other, "", ["status"])
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) == 7
        (other / CONFIG_FILE).write_text("[llm]\nmax_retries = 0\n", encoding="utf-8")
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) is None


@pytest.mark.parametrize(("name", "value"), [("MEMOS_TOKEN", "memos-token-0123"), ("HF_ENDPOINT", "http://127.0.0.1:9"),
                                             ("MY_NOTES_TOKEN", "t0123456789"), ("TZ", "Pacific/Kiritimati")])
def test_tokens_and_the_model_hub_are_part_of_the_environment(tmp_path: Path, monkeypatch, name: str, value: str):
    home = tmp_path / "home"
    monkeypatch.delenv(name, raising=False)
    request = warm_engine.WarmRequest(home, "", ["get", "x"])
    with warm_engine.serving(Brain(home), "test", printing_run, ""):
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) == 7
        monkeypatch.setenv(name, value)
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) is None
        monkeypatch.delenv(name)
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) == 7


def test_a_served_search_never_refreshes_stale_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`brain serve`/`brain mcp` without --watch refresh stale sources before their own searches; a CLI command they
    serve must answer as in its own process: no background sync, no coverage.freshness."""
    for name in [k for k in os.environ if k.startswith(warm_engine.ENV_PREFIXES)]:
        monkeypatch.delenv(name)  # no LLM: `ask` answers with passages
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "a.md").write_text("# Alpha\n\nthe first note about gardening\n", encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    (home / CONFIG_FILE).write_text('[embedding]\nmodel = "use-m3"\nsecond_model = ""\n[sync]\nstale_seconds = 1\n',
                                    encoding="utf-8")
    served_brain = Brain(home)
    assert not served_brain.sync(vaults=(str(vault),)).failed
    time.sleep(1.5)  # every source is now stale
    served_brain.auto_refresh = True
    try:
        with warm_engine.serving(served_brain, "brain serve", cli._run_served, ""):
            for args in (["search", "gardening", "--json", "--mode", "bm25"], ["ask", "gardening", "--json"]):
                out, err = io.StringIO(), io.StringIO()
                assert warm_engine.ask_warm(warm_engine.WarmRequest(home, "", args), out, err) == 0, err.getvalue()
                answer = json.loads(out.getvalue())
                assert answer.get("results") or answer.get("citations"), answer
                assert "freshness" not in answer["coverage"], answer["coverage"]
            assert served_brain._refreshing is None  # no background sync was started
        # the server's own searches (the page's, MCP's) still refresh
        assert served_brain.search("gardening", mode="bm25").coverage["freshness"]["checked"] is True
    finally:
        if served_brain._refreshing is not None:
            served_brain._refreshing.join(60)
        served_brain.close()


def hand_made(home: Path, argv: list[str], raw: bytes | None = None, timeout: float = 10) -> list[dict]:
    """The frames a warm engine sends for a request made by hand (not by `brain`): as `brain` would send it for
    `argv`, or the bytes `raw`."""
    message = warm_engine.request_message(warm_engine.WarmRequest(home.absolute(), "", argv), [False, False])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(warm_engine.socket_path(home)))
        conn.sendall(json.dumps(message).encode() + b"\n" if raw is None else raw)
        frames = [json.loads(line) for line in conn.makefile("r", encoding="utf-8")]
    return frames


def test_the_server_repeats_the_clients_exclusions(tmp_path: Path):
    """Help, version and --queries (which reads the caller's stdin or a file relative to the caller's folder) never
    run in the server, even when a request asks for them."""
    home = tmp_path / "home"
    ran: list[list[str]] = []

    def recording(argv: list[str]) -> int:
        ran.append(argv)
        return printing_run(argv)

    with warm_engine.serving(Brain(home), "test", recording, ""):
        assert hand_made(home, ["status"])[-1] == {"exit": 7}  # a hand-made request the server does run
        for argv in (["search", "--queries", "-"], ["search", "--queries=q.jsonl"], ["search", "x", "--help"],
                     ["status", "-h"], ["get", "--version"]):
            frames = hand_made(home, argv)
            assert len(frames) == 1 and "refused" in frames[0], (argv, frames)
    assert ran == [["--home", str(home.absolute()), "status"]]


def test_another_users_request_is_refused_before_it_is_read(tmp_path: Path, monkeypatch):
    home = tmp_path / "home"
    with warm_engine.serving(Brain(home), "test", printing_run, ""):
        monkeypatch.setattr(warm_engine, "_peer", lambda conn: (12345, os.geteuid() + 1))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:  # connects and sends nothing
            conn.settimeout(3)  # well under ACCEPT_SECONDS: the answer must not wait for a request
            conn.connect(str(warm_engine.socket_path(home)))
            assert json.loads(conn.makefile("r", encoding="utf-8").readline()) == {"refused": "another user"}


def test_a_request_nested_too_deep_is_refused_and_the_server_goes_on(tmp_path: Path):
    home = tmp_path / "home"
    crashed: list[threading.ExceptHookArgs] = []
    hook = threading.excepthook
    threading.excepthook = crashed.append
    try:
        with warm_engine.serving(Brain(home), "test", printing_run, ""):
            for raw in (b"[" * 200_000 + b"\n", b"{not json\n"):
                assert [frame["refused"] for frame in hand_made(home, [], raw=raw)] == ["not a request"]
            assert warm_engine.ask_warm(warm_engine.WarmRequest(home, "", ["status"]), io.StringIO(),
                                        io.StringIO()) == 7
    finally:
        threading.excepthook = hook
    assert crashed == []


# ------------------------------------------------------------------------------------------------ the client's side


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["search", "x"], {}, ("H", "", ["search", "x"])),
    (["--home", "other", "ask", "q", "--json"], {}, ("other", "", ["ask", "q", "--json"])),
    (["--home=other", "--store-url", "http://s:1", "get", "vault:a"], {}, ("other", "http://s:1", ["get", "vault:a"])),
    (["status"], {"BRAIN_STORE_URL": "http://e:2"}, ("H", "http://e:2", ["status"])),
    (["--no-daemon", "search", "x"], {}, None),
    (["search", "x"], {"BRAIN_NO_DAEMON": "true"}, None),
    (["sync", "--vault", "v"], {}, None),
    (["watch"], {}, None),
    (["search", "--help"], {}, None),
    (["search", "--queries", "q.jsonl"], {}, None),
    (["--version"], {}, None),
    (["--verbose", "search", "x"], {}, None),
    ([], {}, None),
])
def test_which_command_lines_try_the_warm_engine(argv, env, expected, tmp_path: Path):
    request = warm_engine.warm_request(argv, {"BRAIN_HOME": str(tmp_path / "H")} | env)
    if expected is None:
        assert request is None
        return
    home, store, args = expected
    assert request is not None
    assert (request.home, request.store_url, request.args) == (
        (tmp_path / "H") if home == "H" else Path(home).absolute(), store, args)


def test_the_client_finds_the_home_the_engine_would_open(monkeypatch, tmp_path: Path):
    assert warm_engine.CONFIG_FILE == CONFIG_FILE
    monkeypatch.delenv("BRAIN_HOME", raising=False)
    assert warm_engine.default_home() == load_settings().home
    monkeypatch.setenv("BRAIN_HOME", str(tmp_path / "h"))
    assert warm_engine.default_home() == load_settings().home == tmp_path / "h"


def test_trying_the_warm_engine_imports_no_engine():
    """`brain search` with a warm engine must not pay for LlamaIndex, Chroma, jieba or the engine before it asks."""
    code = ("import sys; from rag_app.shells import cli_entry, warm_engine; "
            "warm_engine.warm_request(['search', 'x'], {}); "
            "warm_engine.own_socket(warm_engine.default_home()); "
            "warm_engine.request_message(warm_engine.WarmRequest(warm_engine.default_home(), '', ['x']), []); "
            "heavy = [m for m in ('llama_index', 'chromadb', 'jieba', 'torch', 'rag_app.engine', 'rag_app.shells.cli', "
            "'pydantic', 'numpy') if m in sys.modules]; print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


@pytest.mark.parametrize(("argv", "expected"), [
    (["search", "q"], True),
    (["--home", "h", "--no-daemon", "ask", "q", "--json"], True),
    (["--home=h", "get", "vault:x/a.md"], True),
    (["status"], True),
    (["watch"], False),
    (["serve"], False),
    (["mcp"], False),
    (["sync", "--vault", "v"], False),
    (["--verbose-unknown", "search", "q"], False),
    ([], False),
])
def test_only_the_everyday_commands_start_lean_and_end_without_teardown(argv, expected):
    assert warm_engine.one_shot(argv) is expected


def test_a_one_shot_command_ends_with_all_its_output_its_exit_code_and_its_session_turn_kept(home, tmp_path):
    """In-process everyday commands end without the interpreter's teardown: nothing they print or store is lost."""
    vault = tmp_path / "notes"
    vault.mkdir()
    for n in range(30):
        (vault / f"note-{n}.md").write_text(f"# Note {n}\n\nDeploy step {n}: build, push, roll out.\n",
                                           encoding="utf-8")
    synced = subprocess.run([sys.executable, "-m", "rag_app.shells.cli", "--home", str(home), "sync", "--vault",
                             str(vault)], capture_output=True, text=True, timeout=300, env=clean_env())
    assert synced.returncode == 0, synced.stderr
    found = brain(home, "--no-daemon", "search", "deploy step", "-k", "20", "--json")
    assert found.returncode == 0 and len(json.loads(found.stdout)["results"]) == 20, found.stderr
    asked = brain(home, "--no-daemon", "ask", "how do I deploy", "--session", "kept", "--json")
    assert asked.returncode == 0, asked.stderr
    listed = brain(home, "--no-daemon", "sessions", "--json")
    assert [(s["name"], s["turns"]) for s in json.loads(listed.stdout)] == [("kept", 1)]
    missing = brain(home, "--no-daemon", "get", "vault:notes/none.md")
    whole = subprocess.run([sys.executable, "-m", "rag_app.shells.cli", "--home", str(home), "get",
                            "vault:notes/none.md"], capture_output=True, text=True, timeout=300, env=clean_env())
    assert (missing.returncode, missing.stderr) == (whole.returncode, whole.stderr) != (0, "")


@pytest.mark.parametrize("closed", [">&-", "2>&-"])
def test_a_one_shot_command_with_its_output_closed_ends_as_the_cli_does(home, closed):
    """A command started with stdout or stderr closed (a cron line's `>&-`) has no stream to flush at its end: it
    exits as `python -m rag_app.shells.cli` does, not with a traceback and status 1."""
    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", f'exec "$@" {closed}', "sh", *command, "--home", str(home),
                               "--no-daemon", "status"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              cwd=REPO, env=clean_env(), timeout=300)

    lean, whole = run(BRAIN), run(sys.executable, "-m", "rag_app.shells.cli")
    assert whole.returncode == 0, whole.stderr
    assert (lean.returncode, lean.stderr) == (whole.returncode, whole.stderr)


@pytest.mark.parametrize("closed", [">&-", "2>&-"])
def test_a_command_with_its_output_closed_runs_in_process_beside_a_warm_engine(warm_home, closed):
    """The warm client has no stream to ask about or write to: it leaves the command to the in-process CLI, which
    ends as it always does (before: AttributeError on None.isatty and status 1)."""
    done = subprocess.run(["sh", "-c", f'exec "$@" {closed}', "sh", BRAIN, "--home", str(warm_home), "status"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=REPO, env=clean_env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_a_sources_token_env_variable_is_part_of_the_environment(tmp_path: Path, monkeypatch):
    """`get --fresh` reads a Memos note with the token its [[sources]] entry's `token_env` names, whatever the name."""
    home = tmp_path / "home"
    home.mkdir()
    (home / CONFIG_FILE).write_text('[[sources]]\nkind = "memos"\nurl = "http://127.0.0.1:9"\nname = "m"\n'
                                    'token_env = "NOTES_KEY"\n', encoding="utf-8")
    monkeypatch.delenv("NOTES_KEY", raising=False)
    request = warm_engine.WarmRequest(home, "", ["get", "x"])
    with warm_engine.serving(Brain(home), "test", printing_run, ""):
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) == 7
        monkeypatch.setenv("NOTES_KEY", "k-0123456789")
        assert warm_engine.ask_warm(request, io.StringIO(), io.StringIO()) is None


# ------------------------------------------------------------------------------------------------ across upgrades


def old_server(home: Path, ran: list[bytes]) -> tuple[socket.socket, threading.Thread]:
    """A warm engine of the previous protocol (as 202a522's server answers, before issue 30): no version on the wire; it
    runs a request's "argv" with its own, older CLI (which has no --turn-id: exit 2 on every ask) and refuses a
    request without one as "not a command line"."""
    folder = home / warm_engine.SOCKET_DIR
    folder.mkdir(parents=True, mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(folder / warm_engine.SOCKET_NAME))
    listener.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                line = conn.makefile("rb").readline()
                ran.append(line)
                argv = json.loads(line).get("argv")
                if not isinstance(argv, list) or not argv:
                    conn.sendall(b'{"refused": "not a command line"}\n')
                    continue
                conn.sendall(json.dumps({"accepted": {"server": "brain watch", "pid": os.getpid()}}).encode() + b"\n")
                conn.sendall(b'{"err": "Error: No such option: --turn-id\\n"}\n{"exit": 2}\n')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_an_older_warm_engine_is_not_used_and_said_in_one_line(tmp_path: Path):
    """A `brain watch` started before an upgrade speaks the previous protocol: the new `brain` answers in its own
    process, exactly as in-process, with one line saying so (before: "No such option '--turn-id'" on every ask and
    "engine: warm" in status)."""
    vault, home = tea_home(tmp_path)
    assert brain(home, "sync", "--vault", str(vault)).returncode == 0
    ran: list[bytes] = []
    listener, _ = old_server(home, ran)
    try:
        asked = brain(home, "ask", "how hot should green tea be brewed")
        found = brain(home, "search", "green tea", "--json")
        status = brain(home, "status", "--json")
    finally:
        listener.close()
    line = (f"brain: the warm engine runs an older brain (pid {os.getpid()}): restart it (`systemctl --user restart` "
            "its unit, or stop `brain watch` and start it again); running in this process\n")
    here = brain(home, "--no-daemon", "ask", "how hot should green tea be brewed")
    assert (asked.returncode, asked.stdout, asked.stderr) == (0, here.stdout, line)
    assert (found.returncode, found.stderr) == (0, line) and json.loads(found.stdout)["results"]
    assert json.loads(status.stdout)["engine"] == {"mode": "in-process", "why": line[7:-len("; running in this "
                                                                                            "process\n")]}
    assert len(ran) == 3 and all(b'"argv"' not in request for request in ran)  # asked, and never ran anything


def test_a_watch_started_before_an_upgrade_restarts_itself(tmp_path: Path):
    """An editable checkout edited (or a package upgraded) under a running `brain watch`: the next `brain` says it in
    one line and answers in-process; the watch restarts itself (exec: the same pid) and serves the new code warm."""
    code = tmp_path / "install"
    for package in warm_engine.CODE_PACKAGES:
        shutil.copytree(REPO / package, code / package, ignore=shutil.ignore_patterns("__pycache__"))
    vault, home = tea_home(tmp_path)
    env = clean_env(PYTHONPATH=str(code))
    assert brain(home, "sync", "--vault", str(vault), env=env).returncode == 0
    process = start_watch(home, env)
    try:
        pid = json.loads(brain(home, "status", "--json", env=env).stdout)["engine"]["pid"]
        with (code / "rag_app" / "shells" / "cli.py").open("a", encoding="utf-8") as upgrade:
            upgrade.write("\n# a newer brain\n")
        after = brain(home, "status", "--json", env=env)
        assert after.returncode == 0
        assert after.stderr == (f"brain: the warm engine runs an older brain (brain watch, pid {pid}): it restarts "
                                "itself now; running in this process\n")
        assert json.loads(after.stdout)["engine"]["mode"] == "in-process"
        wait_for(lambda: (brain(home, "status", "--json", env=env).stdout or "{}").count('"warm"') == 1, 120)
        again = brain(home, "status", "--json", env=env)
        assert json.loads(again.stdout)["engine"] == {"mode": "warm", "server": "brain watch", "pid": pid}
        assert again.stderr == "" and process.poll() is None
    finally:
        stop(process)
    log = (home / "brain.log").read_text(encoding="utf-8")
    assert log.count("warm engine: serving brain watch") == 2 and "restarting" in log


def test_malformed_requests_are_refused_and_the_server_goes_on(tmp_path: Path):
    home = tmp_path / "home"
    crashed: list[threading.ExceptHookArgs] = []
    hook = threading.excepthook
    threading.excepthook = crashed.append
    good = warm_engine.request_message(warm_engine.WarmRequest(home.absolute(), "", ["status"]), [False, False])
    try:
        with warm_engine.serving(Brain(home), "test", printing_run, ""):
            for bad in ({"tty": "yes"}, {"tty": [1]}, {"tty": None}, {"home": str(home) + "\0"},
                        {"cwd": "/\0tmp"}, {"command": ["status\0"]}, {"env": ["x"]}, {"store_url": 5}):
                frames = hand_made(home, [], raw=json.dumps(good | bad).encode() + b"\n")
                assert len(frames) == 1 and "refused" in frames[0], (bad, frames)
            assert warm_engine.ask_warm(warm_engine.WarmRequest(home, "", ["status"]), io.StringIO(),
                                        io.StringIO()) == 7
    finally:
        threading.excepthook = hook
    assert crashed == []


def test_an_argument_that_is_not_utf8_runs_in_process_without_a_false_alarm(tmp_path: Path):
    home = tmp_path / "home"
    with warm_engine.serving(Brain(home), "test", printing_run, ""):
        done = subprocess.run([BRAIN.encode(), b"--home", str(home).encode(), b"search", b"caf\xe9"],
                              capture_output=True, cwd=REPO, env=clean_env(), timeout=300)
    # the in-process CLI's answer: the serving engine made the home (its socket folder), which holds no notes
    assert (done.returncode, done.stderr) == (0, b"") and b"no notes yet in" in done.stdout
    assert LOST.encode() not in done.stderr


def test_status_says_when_the_socket_path_is_too_long_for_a_warm_engine(tmp_path: Path):
    home = tmp_path / ("h" * (warm_engine.SOCKET_PATH_MAX - len(str(tmp_path))))
    home.mkdir()
    done = brain(home, "status")
    size = len(os.fsencode(warm_engine.socket_path(home)))
    assert done.returncode == 0
    assert f"engine: in-process — no warm engine can serve this home: its socket {warm_engine.socket_path(home)} " \
           f"is {size} bytes, over the 107 a Unix socket allows" in done.stdout


# ------------------------------------------------------------------------------------------------ a client that goes


def test_a_search_whose_client_was_killed_stops_and_the_next_search_is_answered(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    """A search with 11 variants (each one embedding the double serves in 1 s) whose client is killed after two:
    the warm engine stops it at its next step instead of running the other nine while the next client waits behind
    its lock (before: all 11 ran, ~10 s more)."""
    for name in [k for k in os.environ if k.startswith(warm_engine.ENV_PREFIXES)]:
        monkeypatch.delenv(name)
    key = "sk-embed-test-0123456789abcdef"
    monkeypatch.setenv("EMBEDDING_API_KEY", key)
    vault, home = tea_home(tmp_path)
    (vault / "oolong.md").write_text("# Oolong\n\nOolong wants 90 degrees and three short steeps.\n", encoding="utf-8")
    with EmbeddingsDouble(api_key=key) as double:
        (home / CONFIG_FILE).write_text(f'[embedding]\nmodel = "openai:double-embed"\nbase_url = "{double.url}"\n'
                                        'second_model = ""\n', encoding="utf-8")
        assert not Brain(home).sync(vaults=(str(vault),)).failed
        served_brain = Brain(home)
        env = clean_env(EMBEDDING_API_KEY=key)

        def texts() -> list[str]:
            return [text for request in list(double.requests) for text in request.get("texts", [])]

        with warm_engine.serving(served_brain, "test", cli._run_served, ""):
            double.delay = 1.0
            variants = [f"variant {n} of green tea" for n in range(MAX_QUERIES - 1)]
            command = [BRAIN, "--home", str(home), "search", "--mode", "vector"]
            asked_for = ["tea", *(a for v in variants for a in ("--variant", v))]
            long = subprocess.Popen(command + asked_for, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            wait_for(lambda: sum("variant 1 of" in t for t in texts()) == 1, 120)
            long.kill()
            long.wait()
            at_kill = sum(t.startswith("variant") for t in texts())
            # generous: a search that is not stopped also answers within it (after ~10 s), and then fails below
            following = subprocess.run([*command, "--json", "oolong steeps"], cwd=REPO, env=env, capture_output=True,
                                       text=True, timeout=120)
            double.delay = 0.0
        served_brain.close()
    assert following.returncode == 0, following.stderr
    assert json.loads(following.stdout)["results"][0]["title"] == "Oolong"
    asked = texts()
    ran = [t for t in asked if t.startswith("variant")]
    assert len(ran) <= at_kill + 1 < len(variants), ran  # the in-flight embedding at most, then it stopped
    assert max(i for i, t in enumerate(asked) if t.startswith("variant")) < asked.index("oolong steeps")
