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
import time
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


def test_channel_page_peeks_at_the_next_messages_as_text(cluster: Cluster, page: Page) -> None:
    a = cluster.nsqds[0]
    assert cluster.post_nsqd(a, "/topic/create?topic=peekb") == 200
    assert cluster.post_nsqd(a, "/channel/create?topic=peekb&channel=look") == 200
    evil = '<img src=x onerror="window.__pwned=1">'
    cluster.pub(a, "peekb", b"first", evil.encode(), b"third", b"fourth")
    wait_registered(cluster, "peekb")
    page.goto(cluster.admin.url + "/topics/peekb/look")
    depth = page.locator('#channel-nodes tfoot td[data-col="depth"]')
    expect(depth).to_have_text("4")
    page.fill("#peek-n", "3")
    page.click("#peek-channel button")
    bodies = page.locator("#peek-out pre.peek-body")
    expect(bodies).to_have_count(3)
    expect(bodies.nth(0)).to_have_text("first")
    # a body is text: shown as sent, nothing of it runs
    expect(bodies.nth(1)).to_have_text(evil)
    assert page.locator("main img").count() == 0
    assert page.evaluate("window.__pwned") is None
    shot(page, "channel-peek")
    # nothing taken: the depth is the same, and peeking again shows the same
    expect(depth).to_have_text("4")
    assert cluster.stats(a, "peekb")[0]["channels"][0]["in_flight_count"] == 0
    page.click("#peek-channel button")
    expect(bodies.nth(0)).to_have_text("first")


def test_channel_page_sets_the_policy_and_replays_dead_letters(
    cluster: Cluster, page: Page
) -> None:
    a = cluster.nsqds[0]
    assert cluster.post_nsqd(a, "/topic/create?topic=polb") == 200
    assert cluster.post_nsqd(a, "/channel/create?topic=polb&channel=work") == 200
    wait_registered(cluster, "polb")
    page.goto(cluster.admin.url + "/topics/polb/work")
    expect(page.locator("#policy-note")).to_contain_text("Dead letters go to polb.dead")
    page.fill("#policy-max-attempts", "3")
    page.fill("#policy-message-ttl-ms", "60000")
    page.select_option("#policy-overflow", "drop_oldest")
    page.fill("#policy-max-depth", "1000")
    page.click("#channel-policy button[type=submit]")
    expect(page.get_by_test_id("alert-ok")).to_contain_text("policy of work: done")
    got = cluster.nsqd_json(a, "/channel/config?topic=polb&channel=work")
    assert (got["max_attempts"], got["message_ttl_ms"], got["max_depth"], got["overflow"]) == (
        3,
        60000,
        1000,
        "drop_oldest",
    )
    shot(page, "channel-policy")
    # a bad value is the node's clear refusal, shown
    page.fill("#policy-dead-letter-topic", "polb")
    page.click("#channel-policy button[type=submit]")
    expect(page.get_by_test_id("alert-error")).to_contain_text("INVALID_DEAD_LETTER_TOPIC")
    page.fill("#policy-dead-letter-topic", "")
    page.once("dialog", lambda d: d.accept())
    page.click("#replay-dead-letters")
    expect(page.get_by_test_id("alert-ok")).to_contain_text("replay dead letters of work: done")


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


# -- charts, typos, details (issue 28) -----------------------------------------------------


def _chart_bounds(page: Page) -> dict[str, float]:
    box = page.locator('[data-testid="chart"]')
    expect(box).to_have_attribute("data-x-min", re.compile(r"\d"))
    expect(box).to_have_attribute("data-count-min", re.compile(r"\d"))
    return {
        k: float(box.get_attribute(f"data-{k}") or "nan")
        for k in ("x-min", "x-max", "rate-min", "count-min")
    }


def test_charts_show_the_last_minutes_from_zero(cluster: Cluster, page: Page) -> None:
    a = cluster.nsqds[0]
    # a topic opened right after it was created: no point, or one, in its history
    assert cluster.post_nsqd(a, "/topic/create?topic=fresh") == 200
    assert cluster.post_nsqd(a, "/channel/create?topic=fresh&channel=c") == 200
    wait_registered(cluster, "fresh")
    for path in ("/topics/fresh", "/topics/fresh/c"):
        before = time.time()
        page.goto(cluster.admin.url + path)
        bounds = _chart_bounds(page)
        after = time.time()
        # the x axis is the last minute(s) up to now: not 2027-2029, not 1969-1970
        assert before - 60 - 5 <= bounds["x-min"] <= bounds["x-max"] <= after + 5, bounds
        assert bounds["x-max"] - bounds["x-min"] <= 15 * 60 + 1, bounds
        # both y axes start at zero: a small change does not look like a crash
        assert bounds["rate-min"] == 0 and bounds["count-min"] == 0, bounds
    cluster.pub(a, "fresh", *[b"x"] * 5)
    chart = page.locator('[data-testid="chart"]')
    wait_until(lambda: int(chart.get_attribute("data-points") or 0) >= 3, what="points")
    assert _chart_bounds(page)["count-min"] == 0


def test_a_mistyped_topic_says_so_and_offers_nothing(cluster: Cluster, page: Page) -> None:
    page.goto(cluster.admin.url + "/topics/ordersss")
    expect(page.locator("#no-such-topic")).to_contain_text("No nsqd and no nsqlookupd")
    expect(page.locator("#topic-name")).to_have_text("ordersss")
    for what in ("#topic-actions", "#create-channel", '[data-testid="chart"]', "button", "form"):
        expect(page.locator(f"main {what}")).to_have_count(0)
    # a channel of it too: nothing to pause, empty, delete or reset
    page.goto(cluster.admin.url + "/topics/ordersss/work")
    expect(page.locator("#no-such-topic")).to_be_visible()
    expect(page.locator("main button")).to_have_count(0)
    assert "ordersss" not in cluster.lookupd.json("/topics")["topics"]
    # the page shows the topic once it exists
    cluster.pub(cluster.nsqds[0], "ordersss", b"x")
    expect(page.locator("#channel-actions")).to_be_attached()
    expect(page.locator("#not-found")).to_be_visible()  # its channel does not exist (yet)


def test_latency_per_node_and_channel_names_the_node(cluster: Cluster, page: Page) -> None:
    a, b = cluster.nsqds
    for n in (a, b):
        assert cluster.post_nsqd(n, "/topic/create?topic=lat") == 200
        assert cluster.post_nsqd(n, "/channel/create?topic=lat&channel=c") == 200
    cluster.pub(a, "lat", *[b"x"] * 3)
    tail(cluster, "lat", "c", 3)  # finished on a only: b has no latency sample
    wait_registered(cluster, "lat", 2)
    node_a, node_b = f"127.0.0.1:{a.http_port}", f"127.0.0.1:{b.http_port}"
    page.goto(cluster.admin.url + "/topics/lat")
    # a column per percentile for each node and each channel
    expect(cell(page, "topic-nodes", node_a, "e2e_0.5")).to_have_text(re.compile(r"\d"))
    expect(cell(page, "topic-nodes", node_b, "e2e_0.5")).to_have_text("\u2013")
    expect(cell(page, "channels", "c", "e2e_1")).to_have_text(re.compile(r"\d"))
    # min and max name their node; b's empty window is not a 0 ns minimum
    for col in ("min", "max"):
        expect(page.locator(f'#e2e tr[data-row="0.5"] td[data-col="{col}"]')).to_contain_text(
            node_a
        )
    expect(page.locator('#e2e tr[data-row="0.5"] td[data-col="min"]')).not_to_contain_text("0ns")
    page.goto(cluster.admin.url + "/topics/lat/c")
    expect(cell(page, "channel-nodes", node_a, "e2e_0.5")).to_have_text(re.compile(r"\d"))


def test_nodes_show_lookupds_topics_tombstones_and_clients(cluster: Cluster, page: Page) -> None:
    a, b = cluster.nsqds
    node_a = f"127.0.0.1:{a.http_port}"
    cluster.pub(a, "shown", b"1")
    cluster.pub(b, "shown", b"2")
    wait_registered(cluster, "shown", 2)
    page.goto(cluster.admin.url + "/nodes")
    row = page.locator(f'#nodes tr[data-row="{node_a}"]')
    expect(row.locator('td[data-col="remote_addresses"]')).to_contain_text(
        cluster.lookupd.http_address
    )
    expect(row.locator('td[data-col="topic_count"] a:text-is("shown")')).to_have_count(1)
    # tombstone it on a: the Tombstoned column and the node's page say so
    page.goto(cluster.admin.url + "/topics/shown")
    page.locator(f'#topic-nodes tr[data-row="{node_a}"] button.tombstone').click()
    expect(page.locator(f'#topic-nodes tr[data-row="{node_a}"]')).to_have_count(0)
    page.goto(cluster.admin.url + "/nodes")
    expect(row.locator('td[data-col="tombstoned"]')).to_contain_text("shown")
    consumer = subprocess.Popen(
        [sys.executable, "-m", "nsqx", "tail", "--topic=alpha", "--channel=node-page",
         f"--nsqd-tcp-address=127.0.0.1:{a.tcp_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        page.goto(cluster.admin.url + f"/nodes/{node_a}")
        expect(page.locator("#node-tombstones")).to_contain_text("shown")
        expect(page.locator("#node-lookupds")).to_contain_text(cluster.lookupd.http_address)
        client = page.locator("#node-clients tbody tr[data-row]")
        expect(client).to_have_count(1)
        expect(client.locator('td[data-col="where"]')).to_have_text("alpha / node-page")
    finally:
        consumer.send_signal(signal.SIGINT)
        consumer.wait(20)


def test_the_clients_table_fits_1400_px(cluster: Cluster, browser: Browser) -> None:
    a = cluster.nsqds[0]
    cluster.pub(a, "wide", b"x")
    wait_registered(cluster, "wide")
    consumer = subprocess.Popen(
        [sys.executable, "-m", "nsqx", "tail", "--topic=wide", "--channel=c",
         f"--nsqd-tcp-address=127.0.0.1:{a.tcp_port}",
         "--consumer-opt=hostname,worker-042.payments.eu-west-1.compute.internal",
         "--consumer-opt=user_agent,payments-consumer/3.14.159 (python 3.12; nsqx client)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    try:
        pg.goto(cluster.admin.url + "/topics/wide/c")
        expect(pg.locator("#clients tbody tr[data-row]")).to_have_count(1)
        box = pg.locator("#clients").locator("xpath=..")
        sizes = box.evaluate("el => [el.scrollWidth, el.clientWidth]")
        assert sizes[0] <= sizes[1], sizes  # no sideways scrolling
        auth = pg.locator('#clients th[data-col="auth_identity"]').bounding_box()
        assert auth is not None and auth["x"] + auth["width"] <= 1400, auth
    finally:
        context.close()
        consumer.send_signal(signal.SIGINT)
        consumer.wait(20)


# -- a node that hangs, a partition that goes missing (issue 28) -------------------------


@pytest.fixture(scope="module")
def frail(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster of its own, whose nodes the tests stop (the third for good)."""
    c = start_cluster(
        tmp_path_factory.mktemp("frail"),
        "--refresh-interval=200ms",
        "--history-interval=200ms",
        nodes=3,
    )
    yield c
    for n in c.nsqds:
        if n.alive():
            os.kill(n.proc.pid, signal.SIGCONT)
    c.stop()


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP): its state in /proc is T."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def test_missing_partitions_are_shown_with_their_last_node(frail: Cluster, page: Page) -> None:
    adm = frail.admin
    assert adm.request("POST", "/api/topics", {"topic": "orders", "partition_num": 4})[0] == 200
    wait_until(lambda: len(adm.get("/api/topics/orders")["partitions"]) == 4, what="placed")
    assert adm.request("POST", "/api/topics", {"topic": "orders", "channel": "work"})[0] == 200
    b = frail.nsqds[2]
    node_b = f"127.0.0.1:{b.http_port}"
    on_b = sorted(p["partition"] for p in adm.get("/api/topics/orders")["partitions"]
                  if p["node"] == node_b)  # fmt: skip
    assert on_b and len(on_b) < 4, on_b
    page.goto(adm.url + "/topics/orders")
    expect(page.locator("#partitions tbody tr[data-row]")).to_have_count(4)
    b.stop()  # gracefully: it leaves nsqlookupd, as if it had never been there
    expect(page.locator("#partition-num")).to_have_text(f"(4 in the cluster, {len(on_b)} missing)")
    gone = page.locator('#partitions tbody tr[data-down="true"]')
    expect(gone).to_have_count(len(on_b))
    expect(gone.locator('[data-testid="partition-missing"]').first).to_have_text("missing")
    for pid in on_b:
        expect(page.locator(f'#partitions tr[data-row="missing-{pid}"]')).to_contain_text(node_b)
    expect(page.locator("#partitions-missing")).to_contain_text("missing")
    # the Reset form says which partitions it cannot move, and does not offer them
    page.goto(adm.url + "/topics/orders/work")
    expect(page.locator("#reset-missing")).to_contain_text(node_b)
    options = page.locator("#reset-partition option")
    expect(options).to_have_count(5)
    expect(page.locator("#reset-partition option[disabled]")).to_have_count(len(on_b))
    expect(options.first).to_contain_text(f"every answering partition ({4 - len(on_b)} of 4)")
    shot(page, "missing-partitions")
    # and the API says so too
    status, data = adm.request(
        "POST", "/api/topics/orders/work",
        {"action": "setoffset", "position": "special:-1", "partition": on_b[0]},
    )  # fmt: skip
    assert status == 502 and f"partition {on_b[0]} is missing" in data["message"], data
    status, data = adm.request(
        "POST", "/api/topics/orders/work", {"action": "setoffset", "position": "special:-1"}
    )
    assert status == 200 and f"not reset: partition {on_b[0]} is missing" in data["message"]


def test_a_hung_node_does_not_stall_the_pages(frail: Cluster, page: Page) -> None:
    a, b = frail.nsqds[:2]
    frail.pub(a, "hung", b"1")
    frail.pub(b, "hung", b"2", b"3")
    node_a, node_b = f"127.0.0.1:{a.http_port}", f"127.0.0.1:{b.http_port}"
    # an admin of the two nsqd themselves: nsqlookupd drops a silent partition-aware
    # nsqd after its own --node-timeout (and then no admin asks it at all)
    admin = start_admin(
        f"--nsqd-http-address={node_a}",
        f"--nsqd-http-address={node_b}",
        "--refresh-interval=200ms",
        "--history-interval=200ms",
    )
    try:
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            page.goto(admin.url + "/topics/hung")
            # what answered is shown, and the hung node marked, while it is still stopped
            expect(cell(page, "topic-nodes", node_a, "message_count")).to_have_text("1")
            hung = page.locator(f'#topic-nodes tr[data-row="{node_b}"][data-down="true"]')
            expect(hung.locator('[data-testid="not-answering"]')).to_have_text("not answering")
            assert _stopped(b.proc.pid)
            # the admin remembers it: the next reads skip it, or ask it again at most
            # once a second (and wait --node-timeout for it, no longer)
            data = admin.get("/api/topics/hung")
            assert data["message_count"] == 1 and data["message"].startswith("WARNING:")
            (down,) = data["not_answering"]
            assert down["node"] == node_b, down
            page.goto(admin.url + "/nodes")
            health = page.locator(f'#nodes tr[data-row="{node_b}"] [data-health="down"]')
            expect(health).to_have_text("not answering")
            expect(
                page.locator(f'#nodes tr[data-row="{node_a}"] [data-health="ok"]')
            ).to_be_visible()
            page.goto(admin.url + "/topics")
            expect(cell(page, "topics", "hung", "message_count")).to_have_text("1")
            (down,) = admin.get("/api/nodes")["not_answering"]
            assert down["node"] == node_b, down
            assert _stopped(b.proc.pid)
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        # probed in the background: it comes back without a reload
        expect(cell(page, "topics", "hung", "message_count")).to_have_text("3", timeout=45_000)
        assert "not_answering" not in admin.get("/api/topics/hung")
    finally:
        admin.stop()
