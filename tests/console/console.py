"""The web console in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium), against a running `turnpike serve` or fleet. Run by tests/console.rs, which starts
the servers and passes their addresses and tokens in the environment.

Talking back to the Rust side: a line `@@kill` or `@@restart` on stdout asks it to kill or
restart the server; it answers `ok` on stdin once done.

Usage: console.py SCENARIO...   (scenarios: see SCENARIOS at the bottom)
"""

import base64
import json
import os
import sys
import time
import traceback
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE = os.environ["CONSOLE_BASE"]
OTHER_BASE = os.environ.get("CONSOLE_OTHER_BASE", BASE)
ALICE = os.environ["CONSOLE_ALICE"]
BOB = os.environ["CONSOLE_BOB"]
ADMIN = os.environ["CONSOLE_ADMIN"]
ARTIFACTS = os.environ.get("CONSOLE_ARTIFACTS", "/tmp/console-artifacts")
DOWNLOADS = os.environ.get("CONSOLE_DOWNLOADS", "/tmp/console-downloads")
WAIT = float(os.environ.get("CONSOLE_WAIT", "60"))

# A 1×1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# ---------- the API, for setting up and for checking what the browser shows ----------


def call(method, path, token, body=None, base=None, raw=None, headers=None):
    data = None
    h = {"Authorization": f"Bearer {token}"}
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    if raw is not None:
        data, ctype = raw
        h["Content-Type"] = ctype
    h.update(headers or {})
    req = urllib.request.Request((base or BASE) + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read()
            return r.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode(errors="replace")


def ok(method, path, token, body=None, base=None):
    status, out = call(method, path, token, body, base)
    assert 200 <= status < 300, f"{method} {path}: {status} {out}"
    return out


def all_rows(conv, token, base=None):
    rows, after = [], 0
    while True:
        page = ok("GET", f"/v1/conversations/{conv}/messages?after={after}&limit=500", token, base=base)
        rows += page["rows"]
        if not page.get("next_after"):
            return rows
        after = page["next_after"]


def eventually(what, check, timeout=WAIT):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            got = check()
            if got:
                return got
        except AssertionError as e:  # not yet
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f": {last}" if last else ""))


def completed_turns(conv, token, n):
    rows = all_rows(conv, token)
    done = [r for r in rows if r["kind"] == "turn_complete"]
    return rows if len(done) >= n else None


def settled(b):
    """Waits until the page itself has taken in that its conversation is idle with nothing
    pending: the page chooses between a message and a follow-up, and whether to warn of a
    pending approval, from its own copy, which it refreshes a request after the rows."""
    b.wait("the page to take in the turn's end", lambda: (
        b.q("#status").get_attribute("data-status") == "idle"
        and not b.q("#agent-note").get_attribute("textContent")))


# ---------- the browser ----------


class Browser:
    def __init__(self, name, narrow=False):
        self.name = name
        opts = Options()
        opts.binary_location = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")
        for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--disable-background-networking",
                    "--disable-component-update", "--disable-default-apps", "--disable-sync"]:
            opts.add_argument(arg)
        opts.add_argument("--window-size=420,860" if narrow else "--window-size=1280,900")
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        os.makedirs(DOWNLOADS, exist_ok=True)
        opts.add_experimental_option("prefs", {
            "download.default_directory": DOWNLOADS,
            "download.prompt_for_download": False,
        })
        service = Service(executable_path=os.environ.get("CONSOLE_CHROMEDRIVER", "/usr/bin/chromedriver"))
        self.d = webdriver.Chrome(options=opts, service=service)
        self.d.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": DOWNLOADS})

    def quit(self):
        self.d.quit()

    def screenshot(self, tag):
        os.makedirs(ARTIFACTS, exist_ok=True)
        path = os.path.join(ARTIFACTS, f"{self.name}-{tag}.png")
        self.d.save_screenshot(path)
        log(f"screenshot: {path}")

    # -- finding things --

    def q(self, css):
        return self.d.find_element(By.CSS_SELECTOR, css)

    def qs(self, css):
        return self.d.find_elements(By.CSS_SELECTOR, css)

    def wait(self, what, check, timeout=WAIT):
        # Rows are redrawn as they arrive: an element read just as it goes is read again.
        return WebDriverWait(self.d, timeout, poll_frequency=0.05,
                             ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda _: check(), message=what)

    def wait_css(self, css, timeout=WAIT):
        return self.wait(f"an element {css}", lambda: next((e for e in self.qs(css) if e.is_displayed()), None), timeout)

    def usable(self, css, within=None, timeout=WAIT):
        """Waits, as a person would, until an element can be typed into or clicked: shown and
        enabled (a busy machine draws the chat before it enables its message box)."""
        root = within or self.d
        def find():
            for e in root.find_elements(By.CSS_SELECTOR, css):
                if e.is_displayed() and e.is_enabled():
                    return e
            return None
        return self.wait(f"a usable {css}", find, timeout)

    def text_of(self, css):
        return self.q(css).text

    def badge(self):
        return self.q("#badge").get_attribute("data-state")

    # -- the console's console --

    def problems(self):
        """Console errors and failed requests since the last call."""
        bad = [e for e in self.d.get_log("browser") if e["level"] in ("SEVERE",)]
        failed = []
        for entry in self.d.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg["method"] == "Network.loadingFailed" and not msg["params"].get("canceled"):
                failed.append(msg["params"])
            if msg["method"] == "Network.responseReceived":
                status = msg["params"]["response"]["status"]
                if status >= 400:
                    failed.append({"url": msg["params"]["response"]["url"], "status": status})
        return bad + failed

    def assert_clean(self, where):
        problems = self.problems()
        assert not problems, f"{where}: console errors or failed requests: {problems}"

    # -- doing things --

    def open(self, path="/"):
        self.d.get(BASE + path)

    def sign_in(self, token, base=None):
        self.d.get((base or BASE) + "/")
        field = self.wait_css("#token")
        field.send_keys(token)
        self.q("#signin-form button[type=submit]").click()
        self.wait_css("#app")
        self.wait("the identity shown", lambda: self.q("#whoami").text)

    def new_chat(self, app, agent):
        self.q("#new-chat").click()
        self.wait_css("#new-dialog[open]")
        # Signing in shows who you are before the apps are listed.
        self.wait(f"the app {app} listed", lambda: self.qs(f'#new-app option[value="{app}"]'))
        Select(self.q("#new-app")).select_by_value(app)
        Select(self.q("#new-agent")).select_by_value(agent)
        # Where other agents reach the chosen one: its A2A card, which the server serves.
        card = self.wait("the agent's A2A card", lambda: self.q("#new-agent-about .a2a-card").text)
        assert card.endswith(f"/a2a/{app}/{agent}/.well-known/agent-card.json"), card
        # The page may already show a chat: wait for the one just created, not that one (a busy
        # server answers the create after the first look at the address).
        before = self.shown_conversation()
        self.q("#new-create").click()
        conv = self.wait("the new chat to open", lambda: (
            c if (c := self.shown_conversation()) and c != before else None))
        # The address changes before the page opens the chat, and the badge may still be the
        # last chat's: wait for the list to mark this one as the open one.
        self.wait("the new chat loaded", lambda: self.qs(
            f'#conversations li[data-id="{conv}"] a[aria-current="page"]'))
        self.wait("the stream to be live", lambda: self.badge() == "live")
        return conv

    def shown_conversation(self):
        """The id of the conversation the page's address shows, or None."""
        url = self.d.current_url
        if "#/c/conv_" not in url:
            return None
        return url.split("#/c/")[1].split("?")[0].split("/")[0]

    def send(self, text):
        box = self.usable("#input")
        box.clear()
        box.send_keys(text)
        self.usable("#send").click()

    def shown_rows(self):
        """(seq, kind, text) of every record row in the transcript, in page order."""
        return self.d.execute_script(
            "return [...document.querySelectorAll('#transcript li[data-seq]')]"
            ".map(n => [Number(n.dataset.seq), n.dataset.kind])"
        )

    def wait_row(self, kind, contains="", timeout=WAIT):
        def find():
            for n in self.qs(f'#transcript li[data-kind="{kind}"]'):
                if contains in n.get_attribute("textContent"):
                    return n
            return None
        return self.wait(f"a {kind} row containing {contains!r}", find, timeout)

    def drop_file(self, name, mime, data_b64=None, size=None):
        """Drops a file on the chat as a user dragging it from their desktop would."""
        self.d.execute_script(
            """
            const [name, mime, b64, size] = arguments;
            let bytes;
            if (b64) { bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0)); }
            else { bytes = new Uint8Array(size); }
            const file = new File([bytes], name, { type: mime });
            const dt = new DataTransfer();
            dt.items.add(file);
            const target = document.getElementById('chat');
            for (const type of ['dragenter', 'dragover', 'drop']) {
              target.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
            }
            """,
            name, mime, data_b64, size,
        )


def same_rows(browser, conv, token, base=None):
    """The transcript shows exactly the record's rows: each once, in order."""
    def check():
        shown = browser.shown_rows()
        record = [[r["seq"], r["kind"]] for r in all_rows(conv, token, base)]
        assert shown == record, f"shown {shown} != record {record}"
        return True
    return eventually("the transcript to equal the record", check)


def tell(command):
    print(f"@@{command}", flush=True)
    answer = sys.stdin.readline().strip()
    assert answer == "ok", f"{command}: {answer!r}"


# ---------- scenarios ----------


def chat_streams_and_equals_the_record(b):
    b.sign_in(ALICE)
    b.assert_clean("sign in")
    conv = b.new_chat("console", "assistant")
    b.send("tell me a story")
    # The reply streams in: words appear before the reply is committed.
    streamed = b.wait("streamed words", lambda: next(
        (n for n in b.qs("#transcript li.streaming .text") if "Once" in n.text), None))
    assert not b.qs('#transcript li[data-kind="assistant_message"]'), "committed before it streamed"
    assert streamed
    b.wait_row("assistant_message", "happily ever after")
    b.wait("the streamed text gone", lambda: not b.qs("#transcript li.streaming"))
    eventually("the turn", lambda: completed_turns(conv, ALICE, 1))
    same_rows(b, conv, ALICE)
    # The list shows it, newest first, with its status.
    b.wait("the entry first and idle", lambda: (
        (first := b.q("#conversations li")).get_attribute("data-id") == conv
        and first.find_element(By.CSS_SELECTOR, ".pill").get_attribute("data-status") == "idle"))
    b.assert_clean("chat")
    return conv


def reconnects_after_a_restart(b):
    conv = b.new_chat("console", "assistant")
    b.send("a slow one please")
    b.wait("the turn to start streaming", lambda: b.qs("#transcript li.streaming"))
    b.assert_clean("before the kill")
    tell("kill")
    b.wait("the badge to go offline", lambda: b.badge() == "offline")
    tell("restart")
    b.wait("the badge to come back", lambda: b.badge() == "live", timeout=120)
    # Whatever became of the killed turn, the page shows exactly what a fresh read returns.
    b.send("after the restart")
    eventually("a reply after the restart", lambda: any(
        r["kind"] == "assistant_message" and "after the restart" in (r.get("text") or "")
        for r in all_rows(conv, ALICE)), timeout=120)
    same_rows(b, conv, ALICE)
    seqs = [s for s, _ in b.shown_rows()]
    assert len(seqs) == len(set(seqs)), f"a row shown twice: {seqs}"
    b.problems()  # the outage's refused connections are expected; start clean again


def approvals(b):
    conv = b.new_chat("console", "assistant")
    # Approve: the gated call runs once.
    b.send("publish first")
    card = b.wait_css(".approval-card .approve:enabled")
    assert "publish" in b.text_of(".approval-card .tool")
    assert '"path": "note.md"' in b.text_of(".approval-card .arguments")
    card.click()
    reply = b.wait_row("assistant_message", "last tool")
    assert reply.find_elements(By.CSS_SELECTOR, "a.file-link"), "the published file's link"
    rows = eventually("the approved turn", lambda: completed_turns(conv, ALICE, 2))
    settled(b)
    publishes = [r for r in rows if r["kind"] == "tool_call" and r["data"]["tool"] == "publish"]
    results = [r for r in rows if r["kind"] == "tool_result" and r["data"]["call_id"] in
               {p["data"]["call_id"] for p in publishes}]
    assert len(results) == 1 and results[0]["data"]["ok"], results
    # Sending while a card is pending warns first and sends nothing.
    b.send("publish second")
    b.wait("a second card", lambda: len(b.qs(".approval-card .approve:enabled")) == 1)
    # The parked turn has committed all it will (its turn_complete): nothing else is coming.
    eventually("the parked turn", lambda: completed_turns(conv, ALICE, 3))
    # The warning needs the page to know of the pending approval (a request after the card).
    b.wait("the page to know it is pending",
           lambda: "reject" in b.q("#agent-note").get_attribute("textContent"))
    before = len(all_rows(conv, ALICE))
    b.send("something else")
    b.wait_css("#warning")
    assert "approval" in b.text_of("#warning")
    assert len([r for r in all_rows(conv, ALICE) if r["kind"] == "user_message"]) == 2, "sent anyway"
    assert len(all_rows(conv, ALICE)) == before
    b.q("#input").clear()
    # Reject with a reason: the agent's next reply carries it.
    b.usable(".approval-card .reason:enabled").send_keys("not on a friday")
    b.usable(".approval-card .reject:enabled").click()
    b.wait_row("assistant_message", "not on a friday")
    # Switching agent with a pending approval rejects it automatically.
    b.send("publish third")
    b.wait("a third card", lambda: len(b.qs(".approval-card .approve:enabled")) == 1)
    b.wait("the switch note", lambda: "reject" in b.text_of("#agent-note"))
    Select(b.q("#agent-select")).select_by_value("other")
    b.usable("#agent-switch").click()
    b.wait("the card rejected automatically", lambda: any(
        "automatically" in c.text for c in b.qs(".approval-card .state")))
    b.wait_row("agent_switched", "other")
    same_rows(b, conv, ALICE)
    b.assert_clean("approvals")


def controls(b):
    """Steer and stop a running turn from the buttons; ask for a compaction."""
    conv = b.new_chat("console", "assistant")
    b.send("a long task")
    streamed = lambda words: any(words in n.text for n in b.qs("#transcript li.streaming .text"))
    b.wait("the turn to stream", lambda: streamed("Step one"))
    b.usable("#input").send_keys("shorter please")
    b.usable("#steer").click()
    b.wait_row("steer", "shorter please")
    b.wait("the steer taken in the next round", lambda: streamed("shorter please"))
    b.usable("#stop").click()
    b.wait_row("stop", "asked to stop")
    b.wait("the turn marked cancelled", lambda: b.qs('#transcript li.cancelled'))
    rows = all_rows(conv, ALICE)
    assert any(r["kind"] == "turn_complete" and r["data"]["outcome"] == "cancelled" for r in rows), rows
    b.wait("no streamed text left", lambda: not b.qs("#transcript li.streaming"))
    b.usable("#compact").click()
    b.wait_row("compact", "compact")
    eventually("the compaction", lambda: any(
        r["kind"] == "compaction_marker" for r in all_rows(conv, ALICE)))
    same_rows(b, conv, ALICE)
    b.assert_clean("controls")


def questions(b):
    conv = b.new_chat("console", "assistant")
    b.send("pick a colour")
    card = b.wait_css(".question-card")
    assert "Which colour?" in card.text
    b.usable(".answer-text", within=card).send_keys("blue")
    b.usable("button.answer", within=card).click()
    b.wait_row("question_response", "blue")
    eventually("the answered turn", lambda: completed_turns(conv, ALICE, 2))
    b.wait("the card closed", lambda: not card.find_element(By.CSS_SELECTOR, "button.answer").is_enabled())
    same_rows(b, conv, ALICE)
    b.assert_clean("questions")


def attachments(b):
    conv = b.new_chat("console", "assistant")
    b.drop_file("dot.png", "image/png", base64.b64encode(PNG).decode())
    b.wait("the preview", lambda: b.qs(".attachment img.preview"))
    b.wait("the upload", lambda: b.qs('.attachment[data-state="attached"]'))
    b.send("what did I attach")
    reply = b.wait_row("assistant_message", "You attached")
    assert "dot.png" in reply.text, reply.text
    # Over 8 MiB: refused in the browser, nothing uploaded.
    uploads = len(b.qs(".attachment"))
    b.drop_file("big.png", "image/png", size=9 * 1024 * 1024)
    b.wait("the size refusal", lambda: "8 MiB" in b.text_of("#attach-error"))
    assert len(b.qs(".attachment")) == uploads
    # Forced past the browser, the server refuses it too, readably.
    boundary = "turnpikeboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + PNG + b"\0" * (9 * 1024 * 1024) + f"\r\n--{boundary}--\r\n".encode()
    status, out = call("POST", f"/v1/conversations/{conv}/attachments", ALICE,
                       raw=(body, f"multipart/form-data; boundary={boundary}"))
    assert status == 413, (status, out)
    assert "8 MiB" in out["message"], out
    # The reply paints from the live stream before its turn's rows are committed, and the
    # upload's event may be taken by a turn after the message's: wait for its row, then there
    # is exactly one.
    def attachment_rows():
        rows = all_rows(conv, ALICE)
        return [r for r in rows if r["kind"] == "attachment"] or None

    attached = eventually("the attachment's row", attachment_rows)
    assert len(attached) == 1, attached
    same_rows(b, conv, ALICE)
    b.assert_clean("attachments")


def versions(b):
    conv = b.new_chat("console", "writer")
    b.send("first words")
    eventually("turn 1", lambda: completed_turns(conv, ALICE, 1))
    settled(b)
    b.send("second words")
    eventually("turn 2", lambda: completed_turns(conv, ALICE, 2))
    b.wait("turn 2's reply", lambda: len([n for n in b.qs('#transcript li[data-kind="assistant_message"]')
                                          if "saved" in n.get_attribute("textContent")]) >= 2)
    b.usable("#open-versions").click()
    b.wait_css("#versions-view")
    link = b.wait("the file list", lambda: next(
        (a for a in b.qs('#version-files li[data-path="note.md"] a.file-link')), None))
    for f in os.listdir(DOWNLOADS):
        os.remove(os.path.join(DOWNLOADS, f))
    link.click()
    path = os.path.join(DOWNLOADS, "note.md")
    eventually("the download", lambda: os.path.exists(path) and open(path).read() == "second words")
    Select(b.q("#diff-from")).select_by_value("turn_1")
    Select(b.q("#diff-to")).select_by_value("turn_2")
    b.usable("#diff-show").click()
    change = b.wait_css('#diff .change[data-path="note.md"]')
    assert change.get_attribute("data-change") == "modified"
    removed = [s.text for s in b.qs("#diff .removed")]
    added = [s.text for s in b.qs("#diff .added")]
    assert "-first words" in removed and "+second words" in added, (removed, added)
    b.usable("#versions-back").click()
    b.wait_css("#chat")
    b.assert_clean("versions")


def search(b):
    # Another of alice's conversations mentions zebras; bob's does too.
    other = ok("POST", "/v1/conversations", ALICE, {"app": "console", "agent": "assistant"})["id"]
    ok("POST", f"/v1/conversations/{other}/messages", ALICE, {"text": "remember the zebra crossing"})
    bobs = ok("POST", "/v1/conversations", BOB, {"app": "console", "agent": "assistant"})["id"]
    ok("POST", f"/v1/conversations/{bobs}/messages", BOB, {"text": "bob likes the zebra too"})
    for conv, token in [(other, ALICE), (bobs, BOB)]:
        eventually("the turns", lambda: completed_turns(conv, token, 1))
    eventually("the index", lambda: ok("GET", "/v1/search?q=zebra&kinds=prompt", ALICE)["hits"])
    eventually("bob's index", lambda: ok("GET", "/v1/search?q=zebra&kinds=prompt", BOB)["hits"])
    b.open("/#/")
    b.wait_css("#home")  # only the fragment changes: the page routes to its home a task later
    b.usable("#search-q").send_keys("zebra")
    Select(b.q("#search-kind")).select_by_value("prompt")
    b.usable("#search-form button[type=submit]").click()
    hit = b.wait_css(f'#search-results li[data-conversation="{other}"] a')
    shown = {li.get_attribute("data-conversation") for li in b.qs("#search-results li")}
    assert bobs not in shown, "another identity's conversation in the results"
    mine = {c["id"] for c in ok("GET", "/v1/conversations?limit=100", ALICE)["conversations"]}
    assert shown <= mine, f"hits outside alice's conversations: {shown - mine}"
    hit.click()
    marked = b.wait_css("#transcript li.marked")
    assert "zebra crossing" in marked.text, marked.text
    b.assert_clean("search")


def admin(b):
    b.sign_in(ADMIN)
    conv = b.new_chat("console", "assistant")
    b.send("tell me a story")
    b.wait_row("assistant_message", "happily ever after")
    eventually("the turn", lambda: completed_turns(conv, ADMIN, 1))
    b.wait_css("#verify").click()
    b.wait("verify's verdict", lambda: b.q("#admin-result").get_attribute("data-result") == "intact")
    assert "intact" in b.text_of("#admin-result")
    b.usable("#replay").click()
    b.wait("replay's verdict", lambda: b.q("#admin-result").get_attribute("data-result") == "reproduced")
    assert "reproduced" in b.text_of("#admin-result")
    b.assert_clean("admin")
    # A non-admin has no such buttons, and the API refuses them.
    b.usable("#signout").click()
    b.sign_in(ALICE)
    mine = b.new_chat("console", "assistant")
    assert not b.q("#verify").is_displayed() and not b.q("#replay").is_displayed()
    for action in ["verify", "replay"]:
        status, out = call("POST", f"/v1/admin/conversations/{mine}/{action}", ALICE)
        assert status == 403, (action, status, out)
    b.assert_clean("non-admin")


def schedules(b):
    """The caller's schedules, with their firings; a fired one opens its session, which reads
    like a chat, and the session is marked in the list."""
    made = ok("POST", "/v1/schedules", ALICE, {"app": "console", "agent": "other",
                                                "every_seconds": 1, "text": "the digest"})
    sid = made["id"]
    fired = eventually("a fired firing", lambda: next(
        (f for f in ok("GET", f"/v1/schedules/{sid}", ALICE)["firings"] if f["outcome"] == "fired"), None))
    ok("POST", f"/v1/schedules/{sid}/pause", ALICE)
    b.open("/#/schedules")
    row = b.wait_css(f'#schedules tr[data-id="{sid}"]')
    assert "every 1 s" in row.text and "console · other" in row.text, row.text
    link = b.wait("a firing's link", lambda: next(
        (a for a in b.qs(f'#schedules tr[data-id="{sid}"] .firings a')
         if a.get_attribute("href").endswith(fired["conversation"])), None))
    assert "fired" in link.text, link.text
    link.click()
    b.wait("the session to open", lambda: f"#/c/{fired['conversation']}" in b.d.current_url)
    b.wait_row("user_message", "the digest")
    b.wait_row("assistant_message", "the other agent here: the digest")
    eventually("the session's turn", lambda: completed_turns(fired["conversation"], ALICE, 1))
    same_rows(b, fired["conversation"], ALICE)
    # The list as a fresh page load shows it (the session began while this page was open).
    b.d.refresh()
    # The entry is drawn, then redrawn once the conversation opens: read it inside the wait.
    b.wait("the session's entry", lambda: any("session (schedule)" in e.text for e in b.qs(
        f'#conversations li[data-id="{fired["conversation"]}"]')))
    b.assert_clean("schedules")


def narrow(b):
    b.sign_in(ALICE)
    b.wait_css("#new-chat")
    conv = b.new_chat("console", "assistant")
    assert not b.q("#sidebar").is_displayed(), "the list hides while a chat is open on a phone"
    b.send("tell me a story")
    b.wait_row("assistant_message", "happily ever after")
    b.usable("#back").click()
    entry = b.wait_css(f'#conversations li[data-id="{conv}"] a')
    # Back into the same conversation: live again, and a reference with broken percent-encoding
    # in a message is shown, not dropped.
    entry.click()
    b.wait("the stream to be live again", lambda: b.badge() == "live")
    b.send("see conv:gi:conv_01M8RX31PJPXGWB68YA7J12H04/turn_1/a%zz please")
    b.wait_row("assistant_message", "please")
    eventually("both turns", lambda: completed_turns(conv, ALICE, 2))
    same_rows(b, conv, ALICE)
    b.assert_clean("narrow")


def paging(b):
    """A long conversation opens at its end; paging back keeps the reader's place."""
    conv = ok("POST", "/v1/conversations", ALICE, {"app": "console", "agent": "assistant"})["id"]
    for i in range(25):
        ok("POST", f"/v1/conversations/{conv}/messages", ALICE, {"text": f"line {i}"})
        eventually(f"turn {i + 1}", lambda: completed_turns(conv, ALICE, i + 1))
    record = all_rows(conv, ALICE)
    assert len(record) > 100, len(record)
    b.open(f"/#/c/{conv}")
    # Only the address's fragment changes (no reload): the badge is the last chat's until the
    # new one's first page is drawn, and the button comes with that page.
    earlier = b.wait_css("#load-earlier")
    b.wait("the stream to be live", lambda: b.badge() == "live")
    tail = [[r["seq"], r["kind"]] for r in record]
    b.wait("the end of the record", lambda: b.shown_rows() and b.shown_rows() == tail[-len(b.shown_rows()):])
    shown = b.shown_rows()
    assert len(shown) < len(tail), "the whole record on the first page"
    # Where the first shown row sits in the viewport, before and after the older rows arrive.
    first = shown[0][0]
    b.d.execute_script("document.getElementById('transcript-box').scrollTop = 0")
    top = lambda: b.d.execute_script(
        f"return document.querySelector('#transcript li[data-seq=\"{first}\"]').getBoundingClientRect().top")
    before = top()
    earlier.click()
    b.wait("older rows", lambda: len(b.shown_rows()) > len(shown))
    assert abs(top() - before) < 2, (before, top())
    while b.q("#load-earlier").is_displayed():
        count = len(b.shown_rows())
        b.usable("#load-earlier").click()
        b.wait("another page", lambda: len(b.shown_rows()) > count or not b.q("#load-earlier").is_displayed())
    same_rows(b, conv, ALICE)
    b.assert_clean("paging")


def fleet(b):
    """Against two routers: sign in on one, chat, and the other router's record matches."""
    conv = chat_streams_and_equals_the_record(b)
    same_rows(b, conv, ALICE, base=OTHER_BASE)


def measure(b):
    """Not a test: accept → first token painted, over CONSOLE_SAMPLES messages (default 50), on
    the demo app's scripted assistant; and the first load's bytes and time in a fresh browser."""
    samples = int(os.environ.get("CONSOLE_SAMPLES", "50"))
    b.d.get(BASE + "/")
    load = b.d.execute_script(
        "const n = performance.getEntriesByType('navigation')[0];"
        "const r = performance.getEntriesByType('resource');"
        "return {ms: n.loadEventEnd, bytes: n.transferSize + r.reduce((a, e) => a + e.transferSize, 0),"
        " body: n.encodedBodySize + r.reduce((a, e) => a + e.encodedBodySize, 0)};")
    b.sign_in(ALICE)
    b.new_chat("demo", "assistant")
    b.d.execute_script("""
        window.__t = [];
        const real = window.fetch;
        window.fetch = (url, opts) => {
          if (opts && opts.method === 'POST' && String(url).endsWith('/messages')) window.__sent = performance.now();
          return real(url, opts);
        };
        new MutationObserver(() => {
          if (window.__sent === undefined) return;
          const t = document.querySelector('#transcript li.streaming .text');
          if (t && t.textContent) {
            const sent = window.__sent;
            window.__sent = undefined;
            requestAnimationFrame(() => window.__t.push(performance.now() - sent));
          }
        }).observe(document.getElementById('transcript'), {subtree: true, childList: true, characterData: true});
    """)
    for i in range(samples):
        b.send(f"hello {i}")
        b.wait("the sample", lambda: len(b.d.execute_script("return window.__t")) > i)
        b.wait_row("assistant_message", f"hello {i}")
    times = sorted(b.d.execute_script("return window.__t"))
    pct = lambda p: times[min(len(times) - 1, int(p * len(times)))]
    print(f"browser: accept → first token painted p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms "
          f"({len(times)} samples); first load {load['ms']:.0f} ms, {load['body']} bytes of content, "
          f"{load['bytes']} bytes transferred", file=sys.stderr)


SCENARIOS = {
    "measure": [measure],
    "chat": [chat_streams_and_equals_the_record, reconnects_after_a_restart, approvals,
             controls, questions, attachments, versions, search],
    "admin": [admin, schedules],
    "narrow": [narrow, paging],
    "fleet": [fleet],
}


def main():
    failed = False
    for group in sys.argv[1:]:
        b = Browser(group, narrow=(group == "narrow"))
        try:
            for scenario in SCENARIOS[group]:
                log(f"--- {group}: {scenario.__name__}")
                try:
                    scenario(b)
                except Exception:
                    failed = True
                    traceback.print_exc()
                    b.screenshot(scenario.__name__)
                    break
        finally:
            b.quit()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
