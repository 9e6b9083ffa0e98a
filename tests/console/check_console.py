#!/usr/bin/env python3
"""Drives `raftmq console` in a real browser for tests/tests/t27_console.rs: Debian's Chromium,
headless, through Playwright for Python (never `playwright install`: it uses the system browser).

The protocol with the test, one line each:
  stdout  READY leader=<id>          the page shows every node of the group and one leader
  stdin   KILLED <id> <unix_ms>      the test SIGKILLed that leader at that time
  stdout  {"ok": true, ...figures}   the last line; {"ok": false, "error": ...} on any failure

Before READY it checks the read-only console's answers (the transfer refused with 403, a missing
query parameter named). After the kill it watches the page, never reloading it, until it shows
another leader and the election in its timeline, and fails when that took longer than
--max-new-leader-ms after the kill. Then it finds the test's message by key with the lookup box,
opens a topic's and a group's queues, checks that nothing overflows a phone's width and saves a
screenshot at 1280x800 and at 375x800. Last, on the console at --actions-url (started with
--allow-actions), it hands the leadership to a follower with the page's button. Every wait is
bounded.
"""

import argparse
import json
import os
import select
import sys
import time
import traceback

from playwright.sync_api import sync_playwright

# How long the page may take to show what the cluster already shows.
PAGE_WAIT_MS = 30_000
# How long the test may take to answer READY.
KILL_WAIT_S = 60
# How often the page is probed while the election is timed.
PROBE_EVERY_MS = 20


class Failed(Exception):
    """A check that did not hold; its text says which."""


def check(cond, what):
    if not cond:
        raise Failed(what)


def now_ms():
    return time.time() * 1000


def wait_js(page, what, expression, arg=None, timeout_ms=PAGE_WAIT_MS):
    """Waits until `expression` (a JS function of `arg`) returns a truthy value; returns it."""
    try:
        handle = page.wait_for_function(
            expression, arg=arg, timeout=timeout_ms, polling=PROBE_EVERY_MS
        )
    except Exception as e:
        raise Failed(f"the page did not show {what} within {timeout_ms} ms ({type(e).__name__})")
    return handle.json_value()


def leader_shown(page, nodes):
    """The leader once the page lists `nodes` nodes with exactly one marked as leader."""
    return wait_js(
        page,
        f"{nodes} nodes and one leader",
        """(nodes) => {
            const rows = document.querySelectorAll('#brokers tr[data-node]');
            const leaders = document.querySelectorAll('#brokers tr.leader');
            return rows.length === nodes && leaders.length === 1 ? leaders[0].dataset.node : null;
        }""",
        nodes,
    )


def read_only_api(page, url):
    """The read-only console refuses a transfer with 403 and names a missing query parameter."""
    r = page.request.post(url + "api/leader/transfer", data={"broker": "broker-a", "to": 1})
    check(r.status == 403, f"a transfer on a read-only console answered {r.status}: {r.text()}")
    check("--allow-actions" in r.json().get("error", ""), f"403 without the way out: {r.text()}")
    check(
        page.locator("button.transfer").count() == 0,
        "the read-only page shows leader-transfer buttons",
    )
    r = page.request.get(url + "api/topic")
    check(r.status == 400, f"api/topic without a name answered {r.status}")
    check(r.json() == {"error": 'missing query parameter "name"'}, f"api/topic: {r.text()}")
    r = page.request.get(url + "api/msg?topic=x")
    check(r.status == 400, f"api/msg without id or key answered {r.status}")
    check(
        r.json() == {"error": 'missing query parameter "id" or "key"'}, f"api/msg: {r.text()}"
    )


def wait_killed(old):
    """The kill time the test sends once it SIGKILLed node `old`."""
    ready, _, _ = select.select([sys.stdin], [], [], KILL_WAIT_S)
    check(ready, f"no KILLED line from the test within {KILL_WAIT_S} s")
    parts = sys.stdin.readline().split()
    check(len(parts) == 3 and parts[0] == "KILLED", f"unexpected line from the test: {parts}")
    check(parts[1] == str(old), f"the test killed node {parts[1]}, the page showed {old}")
    return int(parts[2])


def election(page, old, kill_ms, max_ms):
    """Times the page showing a new leader and the election in its timeline after the kill."""
    new = wait_js(
        page,
        f"a leader other than node {old}",
        """(old) => {
            const leader = document.querySelector('#brokers tr.leader');
            return leader && leader.dataset.node !== String(old) ? leader.dataset.node : null;
        }""",
        old,
        timeout_ms=10_000,
    )
    new_leader_ms = now_ms() - kill_ms
    gap = wait_js(
        page,
        f"the election node {old} -> node {new} in the timeline",
        """([old, now]) => {
            const row = document.querySelector(
                `#timeline tr[data-kind="elected"][data-old="${old}"][data-new="${now}"]`);
            return row ? row.dataset.gap : null;
        }""",
        [old, new],
        timeout_ms=10_000,
    )
    timeline_ms = now_ms() - kill_ms
    check(
        page.evaluate("window.consoleNeverReloaded === true"),
        "the page was reloaded while the election was watched",
    )
    check(
        new_leader_ms <= max_ms,
        f"the page showed the new leader {new_leader_ms:.0f} ms after the kill (limit {max_ms})",
    )
    return {
        "old_leader": int(old),
        "new_leader": int(new),
        "new_leader_ms": round(new_leader_ms),
        "timeline_ms": round(timeline_ms),
        "gap_ms": int(gap),
    }


def lookup(page, topic, key, body):
    """Finds the message by key with the lookup box; returns how long the answer took."""
    page.fill("#lookup-topic", topic)
    page.select_option("#lookup-by", "key")
    page.fill("#lookup-value", key)
    started = now_ms()
    page.click("#lookup button[type=submit]")
    outcome = wait_js(
        page,
        "the lookup's answer",
        """() => {
            const out = document.querySelector('#lookup-result');
            const e = out.querySelector('.error');
            if (e) return {error: e.textContent};
            const pre = out.querySelector('.msg pre.body');
            return pre ? {body: pre.textContent, fields: out.querySelector('.msg dl').innerText}
                       : null;
        }""",
        timeout_ms=15_000,
    )
    check("error" not in outcome, f"the lookup failed: {outcome.get('error')}")
    check(outcome["body"] == body, f"the lookup showed body {outcome['body']!r}, sent {body!r}")
    for field in ("broker-a", "offset", key):
        check(field in outcome["fields"], f"the lookup's message lacks {field!r}: {outcome}")
    return round(now_ms() - started)


def details(page, topic, group, group_lag):
    """Opens the topic's and the group's queues; checks the group's lag shows."""
    page.click(f'#topics tr[data-topic="{topic}"] button.link')
    wait_js(
        page,
        f"the queues of topic {topic}",
        "() => !!document.querySelector('#topic-detail tbody tr')",
    )
    lag = wait_js(
        page,
        f"group {group} with its lag",
        """(group) => {
            const row = document.querySelector(`#groups tr[data-group="${group}"]`);
            const lag = row && row.cells[3].textContent;
            return lag && lag !== '–' ? lag : null;
        }""",
        group,
    )
    check(lag == str(group_lag), f"group {group} shows lag {lag}, expected {group_lag}")
    page.click(f'#groups tr[data-group="{group}"] button.link')
    wait_js(
        page,
        f"the queues of group {group}",
        "() => !!document.querySelector('#group-detail tbody tr')",
    )


def screenshots(page, out_dir):
    """A desktop and a phone screenshot; at the phone's width nothing may widen the page."""
    os.makedirs(out_dir, exist_ok=True)
    page.screenshot(path=os.path.join(out_dir, "console.png"), full_page=True)
    page.set_viewport_size({"width": 375, "height": 800})
    width = page.evaluate("document.documentElement.scrollWidth")
    check(width <= 375, f"at 375 px the page is {width} px wide (a table should scroll instead)")
    page.screenshot(path=os.path.join(out_dir, "console-phone.png"), full_page=True)


def new_page(browser, js_errors):
    """A desktop-sized page whose uncaught script errors land in `js_errors`."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.on("pageerror", lambda e: js_errors.append(str(e)))
    return page


def transfer(browser, url, js_errors):
    """Hands the leadership to a live follower with its button; returns the node and how long the
    page took to show it leading."""
    page = new_page(browser, js_errors)
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(url, timeout=PAGE_WAIT_MS)
    to = wait_js(
        page,
        "a follower with a leader-transfer button",
        """() => {
            const rows = [...document.querySelectorAll('#brokers tr[data-role="follower"]')];
            const row = rows.find((r) => r.querySelector('button.transfer:not([hidden])'));
            return row ? row.dataset.node : null;
        }""",
    )
    started = now_ms()
    page.click(f'#brokers tr[data-node="{to}"] button.transfer')
    note = wait_js(
        page,
        "the transfer's outcome",
        """() => {
            const note = document.querySelector('#brokers .note');
            return note && !note.hidden && !note.textContent.endsWith('…')
                ? {text: note.textContent, failed: note.classList.contains('error')} : null;
        }""",
        timeout_ms=20_000,
    )
    check(not note["failed"], f"the transfer failed: {note['text']}")
    wait_js(
        page,
        f"node {to} leading",
        "(to) => document.querySelector('#brokers tr.leader')?.dataset.node === to",
        to,
    )
    page.close()
    return {"transfer_to": int(to), "transfer_ms": round(now_ms() - started)}


def run(args):
    check(
        os.path.exists(args.chromium),
        f"{args.chromium} is missing: apt-get install -y chromium",
    )
    figures = {}
    js_errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=args.chromium, args=["--no-sandbox"], headless=True
        )
        page = new_page(browser, js_errors)
        page.goto(args.url, timeout=PAGE_WAIT_MS)
        # A reload would drop this: it proves the page changed by itself.
        page.evaluate("window.consoleNeverReloaded = true")
        old = leader_shown(page, args.nodes)
        read_only_api(page, args.url)
        wait_js(
            page,
            f"topic {args.topic}",
            "(t) => !!document.querySelector(`#topics tr[data-topic=\"${t}\"]`)",
            args.topic,
        )
        print(f"READY leader={old}", flush=True)
        kill_ms = wait_killed(old)
        figures.update(election(page, old, kill_ms, args.max_new_leader_ms))
        figures["lookup_ms"] = lookup(page, args.topic, args.key, args.body)
        details(page, args.topic, args.group, args.group_lag)
        screenshots(page, args.screenshots)
        figures.update(transfer(browser, args.actions_url, js_errors))
        check(not js_errors, f"the page raised: {js_errors}")
        browser.close()
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="the read-only console, ending with /")
    ap.add_argument("--actions-url", required=True, help="a console allowing actions")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--body", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--group-lag", type=int, required=True)
    ap.add_argument("--max-new-leader-ms", type=int, default=2000)
    ap.add_argument("--screenshots", required=True, help="directory for the two PNGs")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    try:
        figures = run(args)
    except Exception as e:
        print(
            json.dumps({"ok": False, "error": str(e), "traceback": traceback.format_exc()}),
            flush=True,
        )
        sys.exit(1)
    print(json.dumps({"ok": True, **figures}), flush=True)


if __name__ == "__main__":
    main()
