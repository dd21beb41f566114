"""nsqadmin in a real browser: headless Chromium (Debian's, driven by Playwright) against a
real cluster (nsqlookupd, two nsqd and the admin, all processes on free loopback ports).

The page's numbers must match the nodes' /stats after publishing and consuming, every
action must work and show its result, live numbers and charts must update without a
reload, and names or client data with HTML in them must be shown as text. The main
views are saved as screenshots (``$NSQX_SCREENSHOT_DIR``, default ``build/screenshots``;
``make screenshots`` refreshes the ones in docs/images).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adminproc import Cluster, start_admin, start_cluster
from lookupdproc import wait_until

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - playwright is a dev dependency
    sync_playwright = None  # type: ignore[assignment]

CHROMIUM = os.environ.get("NSQX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if sync_playwright is None or not os.path.exists(CHROMIUM):
    pytestmark = pytest.mark.skip(
        reason="browser tests need headless Chromium: apt-get install chromium "
        "(or set NSQX_CHROMIUM to a Chromium binary)"
    )
else:
    pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("NSQX_SCREENSHOT_DIR") or REPO / "build" / "screenshots")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("cluster"), "--refresh-interval=200ms", "--history-interval=200ms"
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    expect.set_options(timeout=15_000)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("dialog", lambda d: d.accept())  # the confirm() of dangerous actions
    yield pg
    context.close()
    assert errors == [], errors


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def cell(page: Page, table: str, row: str, col: str) -> Any:
    return page.locator(f'#{table} tbody tr[data-row="{row}"] td[data-col="{col}"]')


def tail(c: Cluster, topic: str, channel: str, n: int, *extra: str) -> None:
    addr = f"127.0.0.1:{c.nsqds[0].tcp_port}"
    subprocess.run(
        [sys.executable, "-m", "nsqx", "tail", f"--topic={topic}", f"--channel={channel}",
         f"--nsqd-tcp-address={addr}", f"--n={n}", *extra],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip


def totals(c: Cluster, topic: str) -> dict[str, int]:
    entries = [t for n in c.nsqds for t in c.stats(n, topic)]
    return {k: sum(t[k] for t in entries) for k in ("depth", "message_count")}


def wait_registered(c: Cluster, topic: str, nodes: int = 1) -> None:
    wait_until(
        lambda: (
            c.lookupd.get(f"/lookup?topic={topic}")[0] == 200
            and len(c.lookupd.json(f"/lookup?topic={topic}")["producers"]) >= nodes
        ),
        what=f"{topic} in nsqlookupd",
    )


def test_topics_page_matches_stats_and_searches_and_sorts(cluster: Cluster, page: Page) -> None:
    a, b = cluster.nsqds
    cluster.pub(a, "alpha", *[b"a"] * 5)
    cluster.pub(b, "alpha", *[b"a"] * 3)
    cluster.pub(a, "alpine", *[b"b"] * 2)
    cluster.pub(b, "beta", *[b"c"] * 11)
    tail(cluster, "alpha", "reader", 4)
    for t, n in (("alpha", 2), ("alpine", 1), ("beta", 1)):
        wait_registered(cluster, t, n)
    page.goto(cluster.admin.url + "/")
    for topic in ("alpha", "alpine", "beta"):
        want = totals(cluster, topic)
        expect(cell(page, "topics", topic, "message_count")).to_have_text(
            f"{want['message_count']:,}"
        )
        expect(cell(page, "topics", topic, "depth")).to_have_text(f"{want['depth']:,}")
    expect(cell(page, "topics", "alpha", "node_count")).to_have_text("2")
    shot(page, "topics")
    # search narrows the list as one types
    page.fill("#topic-search", "alp")
    expect(page.locator("#topics tbody tr[data-row]")).to_have_count(2)
    expect(page.locator('#topics tbody tr[data-row="beta"]')).to_have_count(0)
    page.fill("#topic-search", "")
    # sorting by messages, most first, then least first
    page.click('#topics th[data-col="message_count"]')
    rows = page.locator("#topics tbody tr[data-row]")
    expect(rows.first).to_have_attribute("data-row", "beta")
    page.click('#topics th[data-col="message_count"]')
    expect(rows.first).to_have_attribute("data-row", "alpine")


def test_topic_page_updates_live_and_its_actions_work(cluster: Cluster, page: Page) -> None:
    a = cluster.nsqds[0]
    cluster.pub(a, "live", *[b"x"] * 6)
    tail(cluster, "live", "c1", 2)
    wait_registered(cluster, "live")
    page.goto(cluster.admin.url + "/topics/live")
    (ch,) = cluster.stats(a, "live")[0]["channels"]
    for col in ("depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count"):
        expect(cell(page, "channels", "c1", col)).to_have_text(f"{ch[col]:,}")
    expect(cell(page, "channels", "c1", "depth")).to_have_text("4")
    # new messages show up without a reload, and the chart grows
    chart = page.locator('[data-testid="chart"]')
    wait_until(lambda: int(chart.get_attribute("data-points") or 0) >= 2, what="chart points")
    before = int(chart.get_attribute("data-points") or 0)
    cluster.pub(a, "live", *[b"y"] * 10)
    expect(cell(page, "channels", "c1", "depth")).to_have_text("14")
    wait_until(lambda: int(chart.get_attribute("data-points") or 0) > before, what="a new point")
    expect(page.locator("canvas")).to_have_count(1)  # uPlot drew it
    shot(page, "topic")
    # pause: the badge shows and nsqd has it paused; unpause
    page.click("#pause-topic")
    expect(page.locator("#topic-paused")).to_be_visible()
    expect(page.locator('[data-testid="alert-ok"]')).to_contain_text("pause live: done")
    assert cluster.stats(a, "live")[0]["paused"] is True
    page.click("#pause-topic")
    expect(page.locator("#topic-paused")).to_have_count(0)
    assert cluster.stats(a, "live")[0]["paused"] is False
    # create a channel from the form
    page.fill("#new-channel", "made-here")
    page.click("#create-channel button")
    expect(page.locator('#channels tr[data-row="made-here"]')).to_have_count(1)
    # delete the topic: back to the list, without it
    page.click("#delete-topic")
    expect(page).to_have_url(cluster.admin.url + "/topics")
    expect(page.locator('#topics tr[data-row="live"]')).to_have_count(0)
    assert cluster.stats(a, "live") == []


def test_channel_page_clients_reset_and_delete(cluster: Cluster, page: Page) -> None:
    a = cluster.nsqds[0]
    cluster.pub(a, "chan", *[b"m%d" % i for i in range(8)])
    wait_registered(cluster, "chan")
    evil = '<img src=x onerror="window.__pwned=1">'
    consumer = subprocess.Popen(
        [sys.executable, "-m", "nsqx", "tail", "--topic=chan", "--channel=work",
         f"--nsqd-tcp-address=127.0.0.1:{a.tcp_port}", "--max-in-flight=1",
         f"--consumer-opt=hostname,{evil}", "--consumer-opt=user_agent,<script>bad()</script>"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        page.goto(cluster.admin.url + "/topics/chan/work")
        expect(page.locator("#clients tbody tr[data-row]")).to_have_count(1)
        client = page.locator("#clients tbody tr[data-row]").first
        # the HTML a client sent is shown as text, and nothing ran
        expect(client.locator('td[data-col="hostname"]')).to_have_text(evil)
        expect(client.locator('td[data-col="user_agent"]')).to_have_text("<script>bad()</script>")
        assert page.locator("main img").count() == 0
        assert page.evaluate("window.__pwned") is None
        expect(client.locator('td[data-col="finish_count"]')).to_have_text("8")
        expect(cell(page, "channel-nodes", f"127.0.0.1:{a.http_port}", "depth")).to_have_text("0")
        shot(page, "channel")
    finally:
        consumer.send_signal(signal.SIGINT)
        consumer.wait(20)
    expect(page.locator("#clients tbody tr[data-row]")).to_have_count(0)
    depth = page.locator('#channel-nodes tfoot td[data-col="depth"]')
    # reset to a time before everything: all 8 again
    page.select_option("#reset-kind", "timestamp")
    page.fill("#reset-time", "2001-01-01T00:00:00")
    page.click("#reset-channel button")
    expect(page.locator('[data-testid="alert-ok"]')).to_contain_text("reset work to timestamp:")
    expect(depth).to_have_text("8")
    # to the end: nothing left
    page.select_option("#reset-kind", "special")
    page.click("#reset-channel button")
    expect(depth).to_have_text("0")
    # to a message count: from the 3rd message on
    page.select_option("#reset-kind", "msgcount")
    page.fill("#reset-value", "3")
    page.click("#reset-channel button")
    expect(depth).to_have_text("6")
    page.click("#empty-channel")
    expect(depth).to_have_text("0")
    page.click("#pause-channel")
    expect(page.locator("#channel-paused")).to_be_visible()
    page.click("#delete-channel")
    expect(page).to_have_url(cluster.admin.url + "/topics/chan")
    expect(page.locator('#channels tr[data-row="work"]')).to_have_count(0)


def test_partitions_of_a_topic(cluster: Cluster, page: Page) -> None:
    page.goto(cluster.admin.url + "/topics")
    page.fill("#new-topic", "orders")
    page.fill("#new-partitions", "4")
    page.click("#create-topic button")
    expect(page.locator('[data-testid="alert-ok"]')).to_contain_text("Create orders: done")
    page.locator('#topics a:text-is("orders")').click()
    try:
        expect(page.locator("#partitions tbody tr[data-row]")).to_have_count(4)
    except AssertionError as err:
        # (seen once in CI, not reproduced: say where the partitions went missing)
        raise AssertionError(f"{err}\n{_partition_state(cluster, 'orders')}") from None
    expect(page.locator("#partition-num")).to_have_text("(4 in the cluster)")
    for n in cluster.nsqds:
        cluster.pub(n, "orders", b"o")
    shot(page, "partitions")


def _partition_state(cluster: Cluster, topic: str) -> str:
    """What lookupd, each nsqd and the admin's API say of ``topic`` now."""
    lines = []
    for name, get in [
        ("lookupd /lookup", lambda: cluster.lookupd.json(f"/lookup?topic={topic}")),
        ("admin api", lambda: cluster.admin.get(f"/api/topics/{topic}")),
        *[
            (f"nsqd {n.http_url} /stats", lambda n=n: cluster.stats(n, topic))
            for n in cluster.nsqds
        ],
    ]:
        try:
            lines.append(f"{name}: {get()!r}"[:2000])
        except Exception as err:  # (a diagnostic: show what failed)
            lines.append(f"{name}: {err!r}")
    lines.append("admin log: " + "".join(cluster.admin.log[-20:]))
    return "\n".join(lines)


def test_nodes_page_and_tombstone(cluster: Cluster, page: Page) -> None:
    a, b = cluster.nsqds
    page.goto(cluster.admin.url + "/nodes")
    expect(page.locator("#nodes tbody tr[data-row]")).to_have_count(2)
    expect(page.locator('#nodes [data-health="ok"]')).to_have_count(2)
    expect(page.locator('#lookupds [data-health="ok"]')).to_have_count(1)
    expect(page.locator("#nodes tbody")).to_contain_text("1.3.0-nsqx")
    shot(page, "nodes")
    cluster.pub(a, "drain", b"1")
    cluster.pub(b, "drain", b"2")
    wait_registered(cluster, "drain", 2)
    page.goto(cluster.admin.url + "/topics/drain")
    node = f"127.0.0.1:{a.http_port}"
    page.locator(f'#topic-nodes tr[data-row="{node}"] button.tombstone').click()
    expect(page.locator(f'#topic-nodes tr[data-row="{node}"]')).to_have_count(0)
    assert cluster.stats(a, "drain") == []


def test_html_in_the_address_bar_is_text(cluster: Cluster, page: Page) -> None:
    page.goto(cluster.admin.url + "/topics/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    expect(page.locator('[data-testid="alert-error"]')).to_contain_text("INVALID_TOPIC")
    expect(page.locator("#topic-name")).to_have_text("<img src=x onerror=alert(1)>")
    assert page.locator("main img").count() == 0


def test_counter_page(cluster: Cluster, page: Page) -> None:
    page.goto(cluster.admin.url + "/counter")
    expect(page.locator("#counter")).to_have_text(re.compile(r"^[\d,]+$"))
    shot(page, "counter")


def test_a_user_who_is_not_admin_sees_no_actions(cluster: Cluster, browser: Browser) -> None:
    admin = start_admin(
        f"--lookupd-http-address={cluster.lookupd.http_address}", "--admin-user=alice"
    )
    try:
        context = browser.new_context(extra_http_headers={"X-Forwarded-User": "bob"})
        pg = context.new_page()
        pg.goto(admin.url + "/topics/alpha")
        expect(pg.locator("#cluster")).to_contain_text("read-only")
        expect(pg.locator("#topic-actions")).to_have_count(0)
        expect(pg.locator("#create-channel")).to_have_count(0)
        context.close()
    finally:
        admin.stop()
