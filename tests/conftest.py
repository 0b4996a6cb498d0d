"""Shared fixtures: real files, a real home directory, the fast embedding model unless a test asks otherwise."""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

REPO = Path(__file__).resolve().parents[1]
SAMPLE_VAULT = REPO / "sample_vault"
SHARED = REPO.parent / "shared"


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now (for servers the tests start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(process: subprocess.Popen, timeout: float = 15) -> None:
    """Terminate a server the test started; kill it if it does not exit in time."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAP_VERSION_3 = 0x20080522
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


@contextmanager
def as_an_ordinary_user() -> Iterator[None]:
    """File modes apply to this block even when the tests run as root (CI does): root reads and lists whatever a mode
    says only through two capabilities, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, and this thread drops them from its
    effective set until the block ends. Linux keeps capabilities per thread and only the effective set changes, so
    nothing else runs with less and they come back afterwards; no path is opened up, no other interpreter is needed.
    Not root: nothing to drop."""
    if os.geteuid() != 0:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()

    def call(function: Callable[..., int]) -> None:
        if function(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), f"{function.__name__} failed")

    call(libc.capget)
    kept = data[0].effective
    data[0].effective &= ~(1 << _CAP_DAC_OVERRIDE | 1 << _CAP_DAC_READ_SEARCH)
    call(libc.capset)
    try:
        yield
    finally:
        data[0].effective = kept
        call(libc.capset)


def write_files(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


@pytest.fixture(autouse=True)
def _process_umask() -> Iterator[None]:
    """Every test runs under umask 077, as a brain process does once it opens a home (private.keep_private): what a
    test writes into a home is private as the product's own files are, whichever test ran before (a Brain set the
    umask for the rest of the process, and a test thread may still set it after its test)."""
    from rag_app.index import private

    previous = os.umask(private.PRIVATE_UMASK)
    private._user_umask.clear()
    yield
    os.umask(previous)
    private._user_umask.clear()


@pytest.fixture
def make_vault(tmp_path: Path) -> Callable[..., Path]:
    """`make_vault({"a.md": "..."}, name="notes")` writes a vault folder and returns it."""

    def make(files: dict[str, str | bytes], name: str = "notes") -> Path:
        return write_files(tmp_path / name, files)

    return make


@pytest.fixture(autouse=True)
def _umask_kept() -> Iterator[None]:
    """A Brain opened in the test process makes its umask 077 (rag_app.index.private): the next test starts with
    the umask the session had."""
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A brain home configured with the fast model (USE-m3): sync tests embed in milliseconds, not seconds. Private,
    as `brain` makes a home."""
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    (path / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n', encoding="utf-8")
    (path / "config.toml").chmod(0o600)
    for var in ("BRAIN_HOME", "BRAIN_STORE_URL", "CFLOW_API_TOKEN", "MEMOS_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return path


@pytest.fixture(scope="session")
def sample_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample vault synced once per session with the default model (e5-small), for retrieval tests."""
    from rag_app.engine import Brain

    path = tmp_path_factory.mktemp("sample-home")
    brain = Brain(path)
    report = brain.sync(vaults=(str(SAMPLE_VAULT),))
    assert not report.failed
    return path


@pytest.fixture
def sample_brain(sample_home: Path, monkeypatch: pytest.MonkeyPatch):
    """A Brain over the synced sample vault, no LLM configured."""
    from rag_app.engine import Brain

    for var in ("LLM_BASE_URL", "LLM_MODEL", "LLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    brain = Brain(sample_home)
    yield brain
    brain.close()


def remove_tree(top: Path) -> None:
    """Delete a folder tree of any depth, bottom-up through folder handles (no recursion, no long paths)."""
    stack = [(os.open(top, os.O_RDONLY | os.O_DIRECTORY), "")]
    while stack:
        fd, name = stack[-1]
        child = None
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                child = entry.name
                break
            os.unlink(entry.name, dir_fd=fd)
        if child is not None:
            stack.append((os.open(child, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), child))
            continue
        stack.pop()
        os.close(fd)
        if stack:
            os.rmdir(name, dir_fd=stack[-1][0])
    os.rmdir(top)


@pytest.fixture
def deep_folder() -> Iterator[Callable[[Path, int], Path]]:
    """`deep_folder(root, 1100)` makes root/d/d/.../d and returns the deepest; removed afterwards without recursion,
    because pathlib, os.makedirs and shutil.rmtree (pytest's own temp cleanup) recurse once per level."""
    made: list[Path] = []

    def make(root: Path, depth: int) -> Path:
        path = str(root)
        made.append(Path(root, "d"))
        for _ in range(depth):
            path += "/d"
            os.mkdir(path)
        return Path(path)

    yield make
    for top in made:
        if top.exists():
            remove_tree(top)


def postgres_bin() -> Path | None:
    """The server binaries of the newest PostgreSQL Debian installed (`make install` installs its `postgresql`)."""
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if p.parent.parent.name.isdigit()]
    return max(found, key=lambda folder: int(folder.parent.name)) if found else None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server of its own on 127.0.0.1, run as an unprivileged user (initdb refuses root); yields
    postgresql://brain@127.0.0.1:PORT (trust authentication: no password anywhere)."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (/usr/lib/postgresql/*/bin): `make install` as root installs it")
    top = Path(tempfile.mkdtemp(prefix="brain-pg-"))
    data, port = top / "data", free_port()
    user: str | None = None
    if not os.geteuid():  # root (as in CI): the server runs as an ordinary user instead of being skipped
        user = "postgres" if _has_user("postgres") else "nobody"
        top.chmod(0o755)
        shutil.chown(top, user)
    run = {"user": user, "capture_output": True, "text": True, "timeout": 120}
    made = subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", "brain", "--auth=trust", "-E", "UTF8"],
                          **run)
    if made.returncode != 0:
        shutil.rmtree(top, ignore_errors=True)
        pytest.skip(f"initdb cannot run here: {made.stderr.strip()[-300:]}")
    options = f"-p {port} -k {top} -c listen_addresses=127.0.0.1"
    started = subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(top / "log"),
                              "-w", "start"], **run)
    assert started.returncode == 0, (top / "log").read_text(errors="replace")
    try:
        yield f"postgresql://brain@127.0.0.1:{port}"
    finally:
        subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], **run)
        shutil.rmtree(top, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def postgres_sql(url: str, statement: str) -> None:
    """Run one statement outside a transaction (CREATE DATABASE, ALTER DATABASE) on the server of `url`."""
    import psycopg2

    connection = psycopg2.connect(url)
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement)
    finally:
        connection.close()


@pytest.fixture
def postgres(postgres_server: str) -> str:
    """A fresh database of its own on the test server: postgresql://brain@127.0.0.1:PORT/NAME."""
    name = "t" + uuid.uuid4().hex[:12]
    postgres_sql(f"{postgres_server}/postgres", f"CREATE DATABASE {name}")
    return f"{postgres_server}/{name}"


@pytest.fixture(scope="module")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `chroma run` from this venv on a free port, waited for until its heartbeat answers."""
    data = tmp_path_factory.mktemp("chroma-server")
    port = free_port()
    log = (data / "server.log").open("w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "chroma"), "run", "--path", str(data / "db"), "--host", "127.0.0.1",
         "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/api/v2/heartbeat", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"chroma run did not start: {(data / 'server.log').read_text()[-500:]}")
        time.sleep(0.2)
    yield url
    stop(server)
    log.close()
