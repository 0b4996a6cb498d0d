"""The team deployment's docstore (PostgreSQL): a database failure is a store failure, named in one line with
host:port/database and the cause (no login, SQL, parameters or note text in the output, `brain status` or brain.log),
exit code 2 as for every store error, counts that say what was really done; `brain status` names the docstore.

Through the real CLI in subprocesses against a real PostgreSQL server (tests/conftest.py `postgres`) and real homes.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.fault_trials import run_brain, write_notes
from tests.conftest import free_port, postgres_sql

NOTES = 12


def configure(home: Path, docstore_url: str) -> None:
    (home / "config.toml").write_text(f'[embedding]\nmodel = "use-m3"\n\n[store]\ndocstore_url = "{docstore_url}"\n',
                                      encoding="utf-8")


def where(url: str) -> str:
    """postgresql://host:port/database, as the messages name the docstore."""
    return "postgresql://" + url.split("@", 1)[1]


def test_a_database_that_refuses_writes_mid_sync_is_one_line_with_no_sql_and_nothing_counted(home, tmp_path,
                                                                                           postgres):
    """The database turns read-only after the first sync (what a failover or a full disk does to the writes): the next
    sync's insert fails with SQLAlchemy's text, which holds the statement and the notes' JSON as parameters."""
    login = postgres.replace("brain@", "brain:s3cret-pw@")  # trust authentication: the password is never needed
    configure(home, login)
    vault = tmp_path / "vault"
    write_notes(vault, NOTES)
    first = run_brain(home, "sync", "--vault", str(vault))
    assert first.returncode == 0, first.stderr
    postgres_sql(postgres, f"ALTER DATABASE {postgres.rsplit('/', 1)[1]} SET default_transaction_read_only = on")
    write_notes(vault / "more", 5, seed=7)  # five new notes to write

    done = run_brain(home, "sync", "--vault", str(vault), "--json")
    assert done.returncode == 2, done.stderr
    report = json.loads(done.stdout)
    source = report["sources"][0]
    assert source["failed"] and source["store_failed"] and (source["added"], source["updated"]) == (0, 0)
    assert report["chunks_written"] == 0 and report["exit_code"] == 2
    assert report["error"] == report["store_error"] == source["error"]
    assert report["error"].startswith(f"the docstore {where(postgres)} failed (") and "read-only" in report["error"]
    said = [line for line in done.stderr.splitlines() if line.startswith("brain:")]
    assert len(said) == 1 and where(postgres) in said[0] and "source remove" not in done.stderr

    status = run_brain(home, "status")
    log = (home / "brain.log").read_text(encoding="utf-8")
    for shown in (done.stdout, done.stderr, status.stdout, log):
        for leak in ("INSERT INTO", "[SQL", "parameters", "__data__", "value_m0", "Part 1", "s3cret-pw"):
            assert leak not in shown, (leak, shown[-2000:])
    assert where(postgres) in status.stdout
    recorded = json.loads(run_brain(home, "status", "--json").stdout)["sources"][0]["last_result"]
    assert recorded["error"] == source["error"]


def test_a_database_that_is_down_is_named_with_what_to_do_and_exits_2(home, tmp_path):
    """Nobody listens at the URL's port (the server stopped): a store failure, not the source's."""
    url = f"postgresql://brain@127.0.0.1:{free_port()}/notes"
    vault = tmp_path / "vault"
    write_notes(vault, 3)
    assert run_brain(home, "sync", "--vault", str(vault)).returncode == 0
    configure(home, url)
    (vault / "n001.md").write_text("# Edited\n\nedited", encoding="utf-8")

    done = run_brain(home, "sync", "--vault", str(vault))
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("brain:")]
    assert len(said) == 1, done.stderr
    assert f"the docstore {where(url)} cannot be reached" in said[0] and "Connection refused" in said[0]
    assert "start the database" in said[0] and "docstore_url" in said[0] and "source remove" not in said[0]
    status = run_brain(home, "status", "--json")
    docstore = json.loads(status.stdout)["docstore"]
    assert docstore["name"] == where(url) and docstore["notes"] is None and "cannot be reached" in docstore["error"]


def test_status_names_the_team_docstore_its_notes_and_whether_they_agree(home, tmp_path, postgres):
    login = postgres.replace("brain@", "brain:s3cret-pw@")
    configure(home, login)
    vault = tmp_path / "vault"
    write_notes(vault, 4)
    assert run_brain(home, "sync", "--vault", str(vault)).returncode == 0
    status = run_brain(home, "status", "--json")
    assert json.loads(status.stdout)["docstore"] == {"name": where(postgres), "notes": 4, "agrees": True,
                                                     "error": None}
    text = run_brain(home, "status").stdout
    assert f"docstore: {where(postgres)}: 4 notes, as in the index" in text and "s3cret" not in text
    postgres_sql(postgres, "DELETE FROM data_brain_docstore WHERE key = 'vault:vault/n000.md'")
    text = run_brain(home, "status").stdout
    assert f"docstore: {where(postgres)}: 3 notes, the index has 4: `brain doctor --repair` fills it" in text
    repaired = run_brain(home, "doctor", "--repair")
    assert repaired.returncode == 0, repaired.stdout
    assert json.loads(run_brain(home, "status", "--json").stdout)["docstore"]["agrees"] is True


def test_status_names_the_home_docstore_file(home, tmp_path):
    vault = tmp_path / "vault"
    write_notes(vault, 3)
    assert run_brain(home, "sync", "--vault", str(vault)).returncode == 0
    docstore = json.loads(run_brain(home, "status", "--json").stdout)["docstore"]
    assert docstore == {"name": str(home / "docstore.sqlite"), "notes": 3, "agrees": True, "error": None}


def test_a_docstore_url_of_another_database_is_refused_at_config_load(home):
    """`mysql://` is caught by every command that reads the config, exit 2, one line, no password."""
    configure(home, "mysql://me:s3cret-pw@db.example/brain")
    for args in (("status",), ("search", "compost")):
        done = run_brain(home, *args)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "store.docstore_url must look like postgresql://" in lines[0]
        assert "s3cret-pw" not in done.stderr and "mysql://***@db.example/brain" in lines[0]


def test_the_team_deployment_postgresql_and_a_chroma_server_syncs_and_says_its_stores_agree(home, tmp_path, postgres,
                                                                                            chroma_server):
    """Both team stores at once: the docstore in PostgreSQL, the vectors in `chroma run`; status names the docstore
    and finds it agrees with the index, and a stopped database is a store failure (exit 2), never a source's."""
    configure(home, postgres)
    vault = tmp_path / "vault"
    write_notes(vault, 4)
    done = run_brain(home, "sync", "--vault", str(vault), "--json", store_url=chroma_server)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sources"][0]["added"] == 4 and not (home / "chroma").exists()
    status = json.loads(run_brain(home, "status", "--json", store_url=chroma_server).stdout)
    assert status["docstore"] == {"name": where(postgres), "notes": 4, "agrees": True, "error": None}
    down = postgres.rsplit(":", 1)[0].rsplit("@", 1)
    configure(home, f"{down[0]}@127.0.0.1:{free_port()}/brain")
    write_notes(vault, 5)
    failed = run_brain(home, "sync", "--vault", str(vault), store_url=chroma_server)
    assert failed.returncode == 2 and "start the database" in failed.stderr and "source remove" not in failed.stderr
