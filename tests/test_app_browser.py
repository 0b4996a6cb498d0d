"""The chat page in a real headless Chromium: `brain serve` as a user starts it, a question typed, cited links seen."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.conftest import free_port, stop

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
def page_url(sample_home: Path, tmp_path: Path) -> Iterator[str]:
    """`brain serve` over a copy of the synced sample home with Obsidian links on (the copy keeps the shared home as
    it was)."""
    home = tmp_path / "home"
    shutil.copytree(sample_home, home)
    (home / "config.toml").write_text("[serve]\nobsidian = true\n", encoding="utf-8")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_BASE_URL", "LLM_MODEL", "BRAIN_HOME")}
    brain = Path(sys.executable).with_name("brain")
    server = subprocess.Popen([str(brain), "--home", str(home), "serve", "--port", str(port)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_until_up(url, server)
        yield url
    finally:
        stop(server)


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


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
