/* nsqadmin (nsqx): the page. Plain JavaScript, no build step.
 *
 * Every value from the cluster reaches the page through textContent (the h() helper),
 * never through innerHTML: topic names are checked by nsqd, but client hostnames,
 * user agents and error texts are whatever a client or server sent.
 * Views poll the JSON API every refresh_ms; static parts (forms, charts) are built
 * once per view so that typing is not lost on a refresh.
 */
(function () {
  "use strict";

  var CFG = JSON.parse(document.getElementById("nsqadmin-config").textContent);
  var BASE = CFG.base_path; // ends with "/"
  var app = document.getElementById("app");
  var alerts = document.getElementById("alerts");
  var view = { timers: [], charts: [], token: 0 };

  // -- DOM helpers ----------------------------------------------------------------------

  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === null || v === undefined || v === false) return;
        if (k.slice(0, 2) === "on") el.addEventListener(k.slice(2), v);
        else if (k === "class") el.className = v;
        else if (k === "value") el.value = v;
        else el.setAttribute(k, v === true ? "" : String(v));
      });
    }
    for (var i = 2; i < arguments.length; i++) append(el, arguments[i]);
    return el;
  }

  function append(el, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { append(el, c); }); return; }
    if (typeof child === "string" || typeof child === "number") {
      el.appendChild(document.createTextNode(String(child)));
      return;
    }
    el.appendChild(child);
  }

  function replace(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    for (var i = 1; i < arguments.length; i++) append(el, arguments[i]);
  }

  function link(path, text, attrs) {
    var a = h("a", Object.assign({ href: BASE + path, "data-nav": true }, attrs || {}), text);
    return a;
  }

  function enc(name) { return encodeURIComponent(name); }

  // -- formatting -----------------------------------------------------------------------

  function num(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"); }
  function rate(r) { return r === null || r === undefined ? "–" : (r >= 100 ? r.toFixed(0) : r.toFixed(1)); }
  function nanos(ns) {
    if (ns === null || ns === undefined) return "–";
    if (ns >= 1e9) return (ns / 1e9).toFixed(2) + "s";
    if (ns >= 1e6) return (ns / 1e6).toFixed(1) + "ms";
    if (ns >= 1e3) return (ns / 1e3).toFixed(1) + "µs";
    return Math.round(ns) + "ns";
  }
  function since(ns) {
    var s = Math.floor(ns / 1e9), out = "";
    var d = Math.floor(s / 86400), hh = Math.floor(s % 86400 / 3600);
    var m = Math.floor(s % 3600 / 60), sec = s % 60;
    if (d) out += d + "d";
    if (d || hh) out += hh + "h";
    if (d || hh || m) out += m + "m";
    return out + sec + "s";
  }
  function quantile(q) { return (q * 100).toFixed(q * 100 % 1 ? 1 : 0) + "%"; }

  // -- the API --------------------------------------------------------------------------

  function ApiError(message, status) { this.message = message; this.status = status; }
  ApiError.prototype = Object.create(Error.prototype);
  ApiError.prototype.name = "ApiError";

  function api(method, path, body) {
    var opts = { method: method, headers: { "Accept": "application/json" } };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    return fetch(BASE + path, opts).then(function (r) {
      return r.text().then(function (text) {
        var data;
        try { data = JSON.parse(text); } catch (e) { data = { message: text || r.statusText }; }
        if (!r.ok) throw new ApiError((data && data.message) || ("HTTP " + r.status), r.status);
        return data;
      });
    });
  }

  function flash(kind, text) {
    var el = h("div", { class: "alert " + kind, role: kind === "error" ? "alert" : "status",
                        "data-testid": "alert-" + kind }, text);
    replace(alerts, el);
  }

  function warnOf(data) {
    if (data && data.message) flash("warning", data.message);
  }

  function act(label, promise, after) {
    return promise.then(function (data) {
      if (data && data.message) flash("warning", label + ": " + data.message);
      else flash("ok", label + ": done");
      if (after) after(data);
    }, function (err) {
      flash("error", label + " failed: " + (err.message || err));
    });
  }

  // -- view life cycle ------------------------------------------------------------------

  function leave() {
    view.timers.forEach(clearInterval);
    view.charts.forEach(function (c) { c.destroy(); });
    view = { timers: [], charts: [], token: view.token + 1 };
  }

  // run fn now and every refresh_ms while this view is shown; errors show once
  function poll(fn) {
    var token = view.token;
    var busy = false;
    function tick() {
      if (busy || token !== view.token) return;
      busy = true;
      Promise.resolve().then(fn).catch(function (err) {
        if (token === view.token) flash("error", err.message || String(err));
      }).then(function () { busy = false; });
    }
    tick();
    view.timers.push(setInterval(tick, CFG.refresh_ms));
  }

  function navigate(path) {
    history.pushState(null, "", BASE + path);
    render();
  }

  document.addEventListener("click", function (ev) {
    var a = ev.target.closest && ev.target.closest("a[data-nav]");
    if (!a || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
    ev.preventDefault();
    alerts.textContent = "";
    history.pushState(null, "", a.getAttribute("href"));
    render();
  });
  window.addEventListener("popstate", render);

  function route() {
    var path = location.pathname;
    var rest = path.indexOf(BASE) === 0 ? path.slice(BASE.length) : path.replace(/^\//, "");
    if (BASE.length > 1 && path === BASE.slice(0, -1)) rest = "";
    var parts = rest.split("/").filter(function (p) { return p !== ""; });
    try {
      parts = parts.map(decodeURIComponent);
    } catch (e) {
      parts = ["?"];
    }
    return parts;
  }

  function render() {
    leave();
    var parts = route();
    var section = parts[0] || "topics";
    document.querySelectorAll("header nav a").forEach(function (a) {
      a.classList.toggle("active", a.getAttribute("data-section") === section);
    });
    replace(app);
    if (section === "topics" && parts.length === 1 || parts.length === 0) topicsView();
    else if (section === "topics" && parts.length === 2) topicView(parts[1]);
    else if (section === "topics" && parts.length === 3) channelView(parts[1], parts[2]);
    else if (section === "nodes" && parts.length === 1) nodesView();
    else if (section === "nodes" && parts.length === 2) nodeView(parts[1]);
    else if (section === "counter") counterView();
    else if (section === "lookup") lookupView();
    else replace(app, h("h1", null, "Not found"), h("p", { class: "muted" }, "No such page."));
  }

  // -- tables ---------------------------------------------------------------------------

  /* A table whose rows are redrawn on each refresh. columns: [{key, label, text?,
   * sort?: bool, cell(row) -> node|string}]. Sorting state survives refreshes. */
  function Table(id, columns, opts) {
    opts = opts || {};
    this.sortKey = opts.sortKey || null;
    this.sortDir = opts.sortDir || 1;
    this.rows = [];
    this.filter = null;
    this.thead = h("thead");
    this.tbody = h("tbody");
    this.foot = h("tfoot");
    this.table = h("table", { id: id, class: opts.class || null }, this.thead, this.tbody, this.foot);
    this.el = h("div", { class: "scroll" }, this.table);
    this.empty = opts.empty || "none";
    this.setColumns(columns);
  }

  // (re)build the header; a no-op when the columns are the same keys
  Table.prototype.setColumns = function (columns) {
    var self = this;
    var keys = columns.map(function (c) { return c.key; }).join("\u0000");
    if (keys === this.keys) return;
    this.keys = keys;
    this.columns = columns;
    this.ths = columns.map(function (c) {
      var th = h("th", { class: (c.text ? "text " : "") + (c.sort ? "sortable" : ""),
                         "data-col": c.key, scope: "col", title: c.title || null }, c.label);
      if (c.sort) {
        th.addEventListener("click", function () {
          if (self.sortKey === c.key) self.sortDir = -self.sortDir;
          else { self.sortKey = c.key; self.sortDir = c.text ? 1 : -1; }
          self.draw();
        });
      }
      return th;
    });
    replace(this.thead, h("tr", null, this.ths));
    if (this.rows.length || this.total) this.draw();
  };

  Table.prototype.set = function (rows, total) {
    this.rows = rows;
    this.total = total || null;
    this.draw();
  };

  Table.prototype.draw = function () {
    var self = this;
    var rows = this.rows.filter(function (r) { return !self.filter || self.filter(r); });
    if (this.sortKey) {
      var key = this.sortKey, dir = this.sortDir;
      rows = rows.slice().sort(function (a, b) {
        var x = a[key], y = b[key];
        if (x === null || x === undefined) x = typeof y === "string" ? "" : -Infinity;
        if (y === null || y === undefined) y = typeof x === "string" ? "" : -Infinity;
        return (x < y ? -1 : x > y ? 1 : 0) * dir;
      });
    }
    this.ths.forEach(function (th) {
      var k = th.getAttribute("data-col");
      if (k === self.sortKey) th.setAttribute("aria-sort", self.sortDir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    });
    replace(this.tbody, rows.length ? rows.map(function (r) { return self.row(r, ""); })
      : h("tr", null, h("td", { class: "muted", colspan: this.columns.length }, this.empty)));
    replace(this.foot, this.total ? this.row(this.total, "total") : null);
  };

  /* A row with _down (a node that did not answer, or a missing partition) shows its
   * first cell, a badge (_badge, default "not answering") with _down as its title,
   * and "–" in every other cell. */
  Table.prototype.row = function (r, cls) {
    return h("tr", { class: (cls || "") + (r._down ? " down" : ""),
                     "data-row": r._id !== undefined ? r._id : null, "data-down": r._down ? "true" : null },
      this.columns.map(function (c, i) {
        var v;
        if (r._down && i > 0) v = c.downCell ? c.downCell(r) : "–";
        else v = c.cell ? c.cell(r) : r[c.key];
        if (typeof v === "number") v = num(v);
        if (r._down && i === 0) {
          v = [v, h("span", { class: "badge bad", "data-testid": r._badgeId || "not-answering", title: r._down },
                    r._badge || "not answering")];
        }
        return h("td", { class: (c.text ? "text" : "") + (c.wrap ? " wrap" : "") || null, "data-col": c.key }, v);
      }));
  };

  // rows for the nodes of an answer's not_answering that are not among rows already
  function downRows(data, rows, extra) {
    var have = {};
    rows.forEach(function (r) { have[r.node] = true; });
    return (data.not_answering || []).filter(function (d) { return !have[d.node]; }).map(function (d) {
      return Object.assign({ _id: d.node, node: d.node, hostname: d.hostname || d.node,
        _down: (d.skipped ? "not asked: known not to answer since " + new Date(d.since * 1000).toLocaleTimeString() + " (" + d.error + ")" : d.error) }, extra || {});
    });
  }

  // -- charts ---------------------------------------------------------------------------

  /* A chart of a history series. The x axis is always a time window ending now (at
   * least the last minute, at most the history kept), whatever the number of points;
   * both y axes start at zero, so that small changes do not look like crashes. */
  function chart(container, series) {
    if (typeof uPlot === "undefined") return null;
    var width = Math.max(320, container.clientWidth || 900);
    var state = { x: null };
    function fromZero(u, min, max) {
      return [0, max !== null && max !== undefined && max > 0 ? max * 1.1 : 1];
    }
    var opts = {
      width: width, height: 220,
      scales: { x: { time: true, auto: false, range: function (u, min, max) {
        return state.x || [min, max];
      } }, rate: { range: fromZero }, count: { range: fromZero } },
      series: [{}].concat(series.map(function (s) {
        return { label: s.label, stroke: s.color, width: 2, scale: s.scale,
                 value: function (u, v) { return v === null ? "–" : (s.scale === "rate" ? rate(v) : num(v)); },
                 spanGaps: false };
      })),
      axes: [{}, { scale: "rate", label: "msgs/s" },
             { scale: "count", side: 1, label: "messages", grid: { show: false } }],
      legend: { live: true },
      hooks: { setScale: [function (u, key) {
        // for tests and the curious: the scales' bounds on the chart's box
        var sc = u.scales[key];
        if (sc && sc.min !== null && sc.min !== undefined) {
          container.setAttribute("data-" + key + "-min", String(sc.min));
          container.setAttribute("data-" + key + "-max", String(sc.max));
        }
      }] }
    };
    var data = [[]].concat(series.map(function () { return []; }));
    var u = new uPlot(opts, data, container);
    u._window = state;
    view.charts.push(u);
    return u;
  }

  function historyPoller(u, container, query, fields) {
    return function () {
      return api("GET", "api/history?" + query).then(function (data) {
        var pts = data.points || [];
        container.setAttribute("data-points", String(pts.length));
        if (!u) return;
        var now = data.now || Date.now() / 1000;
        var first = pts.length ? pts[0].ts : now;
        var start = Math.max(Math.min(first, now - 60), now - (data.length || CFG.history_length));
        u._window.x = [start, now];
        var cols = [pts.map(function (p) { return p.ts; })];
        fields.forEach(function (f) { cols.push(pts.map(function (p) { return p[f]; })); });
        u.setData(cols);
        u.setScale("x", { min: start, max: now });
      });
    };
  }

  function chartSection(title, query, series) {
    var box = h("div", { class: "chart", "data-testid": "chart", "data-points": "0" });
    var minutes = Math.round(CFG.history_length / 60);
    var sec = h("section", null,
      h("h2", null, title, h("span", { class: "muted" },
        " · last " + minutes + " min, a point every " + CFG.history_interval + " s")),
      box);
    var u = null;
    // uPlot measures its box: create it once the section is in the page
    setTimeout(function () {
      u = chart(box, series);
      poller().catch(function () { /* the view's own poll shows errors */ });
    }, 0);
    var fields = series.map(function (s) { return s.field; });
    var poller = function () { return historyPoller(u, box, query, fields)(); };
    return { el: sec, poll: function () { return poller(); } };
  }

  // -- e2e latency --------------------------------------------------------------------------

  function e2eTable(e2e) {
    var pcts = (e2e && e2e.percentiles) || [];
    if (pcts.length && !e2e.count) return h("p", { class: "muted", "data-testid": "e2e-empty" },
      "No message was finished in the latency window yet.");
    if (!pcts.length) return h("p", { class: "muted", "data-testid": "e2e-none" },
      "No latency to show: nsqd measures it per channel, with --e2e-processing-latency-percentile.");
    function withNode(ns, node) {
      return [nanos(ns), node ? h("span", { class: "muted node" }, " " + node) : null];
    }
    return h("table", { id: "e2e" },
      h("thead", null, h("tr", null, h("th", { class: "text" }, "Percentile"),
        h("th", null, "Average"), h("th", null, "Min (node)"), h("th", null, "Max (node)"),
        h("th", null, "Samples"))),
      h("tbody", null, pcts.map(function (p) {
        return h("tr", { "data-row": String(p.quantile) },
          h("td", { class: "text" }, quantile(p.quantile)),
          h("td", { "data-col": "average" }, nanos(p.average)),
          h("td", { "data-col": "min" }, withNode(p.min, p.min_node)),
          h("td", { "data-col": "max" }, withNode(p.max, p.max_node)),
          h("td", { "data-col": "count" }, num(p.count)));
      })));
  }

  // one column per percentile of e2e: each row's own value (over nodes: the average)
  function e2eColumns(e2e) {
    return ((e2e && e2e.percentiles) || []).map(function (p) {
      var q = p.quantile;
      return { key: "e2e_" + q, label: "E2E " + quantile(q),
               title: "end-to-end processing latency, " + quantile(q) + " percentile",
               cell: function (r) {
                 var e = r.e2e_processing_latency;
                 var mine = ((e && e.percentiles) || []).filter(function (x) { return x.quantile === q; })[0];
                 return mine && mine.count ? nanos(mine.average) : "–";
               } };
    });
  }

  function confirmThen(question, fn) {
    return function () { if (window.confirm(question)) fn(); };
  }

  function adminOnly(node) { return CFG.is_admin ? node : null; }

  // -- Topics ---------------------------------------------------------------------------

  function topicsView() {
    var search = h("input", { type: "search", placeholder: "Search topics", id: "topic-search",
                              "aria-label": "Search topics" });
    var table = new Table("topics", [
      { key: "topic_name", label: "Topic", text: true, sort: true,
        cell: function (t) {
          return [link("topics/" + enc(t.topic_name), t.topic_name),
                  t.paused ? h("span", { class: "badge paused" }, "paused") : null];
        } },
      { key: "depth", label: "Depth", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "rate", label: "Msgs/s", sort: true, cell: function (t) { return rate(t.rate); } },
      { key: "channel_count", label: "Channels", sort: true },
      { key: "node_count", label: "Nodes", sort: true },
      { key: "partition_num", label: "Partitions", sort: true,
        cell: function (t) { return t.partition_num ? num(t.partition_num) : "–"; } }
    ], { sortKey: "topic_name", sortDir: 1, empty: "No topics yet." });
    table.filter = function (t) {
      var q = search.value.trim().toLowerCase();
      return !q || t.topic_name.toLowerCase().indexOf(q) >= 0;
    };
    search.addEventListener("input", function () { table.draw(); });
    var count = h("span", { class: "muted", id: "topic-count" });

    var topic = h("input", { name: "topic", placeholder: "topic", required: true, id: "new-topic" });
    var channel = h("input", { name: "channel", placeholder: "channel (optional)", id: "new-channel" });
    var parts = h("input", { name: "partition_num", type: "number", min: "0", max: "255",
                             placeholder: "partitions", id: "new-partitions", style: "width:110px" });
    var form = h("form", { class: "inline", id: "create-topic" },
      h("label", { for: "new-topic" }, "Create a topic"), topic, channel,
      CFG.nsqlookupd.length ? parts : null,
      h("button", { class: "primary", type: "submit" }, "Create"));
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var body = { topic: topic.value.trim(), channel: channel.value.trim() };
      if (parts.value) body.partition_num = Number(parts.value);
      act("Create " + body.topic, api("POST", "api/topics", body), function () {
        topic.value = ""; channel.value = ""; parts.value = "";
        refresh();
      });
    });

    replace(app, h("h1", null, "Topics ", count),
      h("div", { class: "toolbar" }, search), table.el, adminOnly(form));

    function refresh() {
      return api("GET", "api/topics?stats=true").then(function (data) {
        warnOf(data);
        var rows = (data.stats || []).map(function (t) { t._id = t.topic_name; return t; });
        count.textContent = "(" + rows.length + ")";
        table.set(rows);
      });
    }
    poll(refresh);
  }

  // a topic that no server knows: say so, and offer nothing that would create it
  function missingTopic(name) {
    replace(app,
      h("h1", null, "No such topic: ", h("span", { id: "topic-name" }, name)),
      h("p", { class: "alert warning", id: "no-such-topic", "data-testid": "no-such-topic" },
        "No nsqd and no nsqlookupd of this cluster knows a topic named \u201c" + name +
        "\u201d. Check the name, or go back to ", link("topics", "the topics"), "."),
      h("p", { class: "muted" }, "This page shows the topic if it appears."));
  }

  /* Load a topic's page only once the topic is known to exist: a mistyped name shows
   * "no such topic" (and keeps watching), never actions or forms. */
  function whenTopicExists(name, path, show) {
    var token = view.token;
    replace(app, h("h1", null, "Topic ", h("span", { id: "topic-name" }, name)),
      h("p", { class: "muted" }, "Loading…"));
    poll(function () {
      return api("GET", path).then(function (data) {
        if (token !== view.token) return;
        leave();
        show(data);
      }, function (err) {
        if (token !== view.token) return;
        if (err.status === 404 && /TOPIC_NOT_FOUND/.test(err.message)) { missingTopic(name); return; }
        if (err.status === 404) { leave(); show(null, err); return; }
        throw err;
      });
    });
  }

  function partitionRows(data) {
    var rows = (data.partitions || []).map(function (p) { p._id = p.partition + "@" + p.node; return p; });
    (data.missing_partitions || []).forEach(function (m) {
      rows.push(Object.assign({}, m, { _id: "missing-" + m.partition, _down: missingText(m),
                                       _badge: "missing", _badgeId: "partition-missing" }));
    });
    return rows;
  }

  function missingText(m) {
    var where = m.node ? "last seen on " + (m.hostname || m.node) + " (" + m.node + ")" : "never seen by this admin";
    var why = { not_answering: "its node is not answering", not_on_node: "its node no longer has it",
                not_listed: "its node is not in the cluster now" }[m.reason] || "no node has it";
    return why + "; " + where;
  }

  function lastNodeCell(p) {
    if (!p._down) return p.node;
    return p.node ? (p.hostname || p.node) + " (" + p.node + ", last known)" : "unknown";
  }

  function missingNote(el, data, what) {
    var ms = data.missing_partitions || [];
    el.hidden = !ms.length;
    if (!ms.length) return;
    replace(el, "Partition" + (ms.length > 1 ? "s " : " ") + ms.map(function (m) { return m.partition; }).join(", ") +
      " of " + data.partition_num + (ms.length > 1 ? " are" : " is") + " missing" + (what || "") + ": ",
      ms.map(function (m) { return "partition " + m.partition + ": " + missingText(m); }).join("; "), ".");
  }

  // -- one topic ------------------------------------------------------------------------

  function topicView(name) {
    whenTopicExists(name, "api/topics/" + enc(name), function (first) { topicPage(name, first); });
  }

  function topicPage(name, first) {
    var title = h("h1", null, "Topic ", h("span", { id: "topic-name" }, name));
    var pauseBtn = h("button", { id: "pause-topic" }, "Pause");
    var paused = false;
    pauseBtn.addEventListener("click", function () {
      var action = paused ? "unpause" : "pause";
      act(action + " " + name, api("POST", "api/topics/" + enc(name), { action: action }), refresh);
    });
    var actions = h("div", { class: "toolbar", id: "topic-actions" }, pauseBtn,
      h("button", { class: "danger", id: "empty-topic", onclick: confirmThen(
        "Empty topic " + name + "? Its queued messages are dropped.", function () {
          act("empty " + name, api("POST", "api/topics/" + enc(name), { action: "empty" }), refresh);
        }) }, "Empty"),
      h("button", { class: "danger", id: "delete-topic", onclick: confirmThen(
        "Delete topic " + name + " and all its channels?", function () {
          act("delete " + name, api("DELETE", "api/topics/" + enc(name)), function () {
            navigate("topics");
          });
        }) }, "Delete"));

    var ch = chartSection("Published messages/s and depth", "topic=" + enc(name), [
      { label: "msgs/s", field: "message_rate", scale: "rate", color: "#1f6feb" },
      { label: "depth", field: "depth", scale: "count", color: "#d4a72c" }
    ]);

    var nodeCols = [
      { key: "node", label: "Node", text: true, sort: true, cell: function (n) {
        return n.node === "*" ? "Total" : link("nodes/" + enc(n.node), n.hostname + " (" + n.node + ")");
      } },
      { key: "depth", label: "Depth", sort: true },
      { key: "memory_depth", label: "Memory + Disk",
        cell: function (n) { return num(n.memory_depth) + " + " + num(n.backend_depth); } },
      { key: "message_count", label: "Messages", sort: true },
      { key: "channels", label: "Channels", cell: function (n) { return num((n.channels || []).length); } },
      { key: "paused", label: "Paused", cell: function (n) { return n.paused ? "paused" : ""; } }
    ];
    var tombCol = { key: "tombstone", label: "", cell: function (n) {
      if (n.node === "*" || !CFG.is_admin || !CFG.nsqlookupd.length) return "";
      return h("button", { class: "danger tombstone", onclick: confirmThen(
        "Tombstone " + name + " on " + n.node + "? The topic is deleted there.", function () {
          act("tombstone " + n.node, api("DELETE", "api/nodes/" + enc(n.node), { topic: name }), refresh);
        }) }, "Tombstone");
    }, downCell: function () { return ""; } };
    var nodes = new Table("topic-nodes", nodeCols.concat([tombCol]), { empty: "No node has this topic." });

    var partSection = h("section", { id: "partitions-section", hidden: true });
    var parts = new Table("partitions", [
      { key: "partition", label: "Partition", text: true, sort: true, cell: function (p) { return String(p.partition); } },
      { key: "node", label: "Node", text: true, sort: true, cell: lastNodeCell, downCell: lastNodeCell },
      { key: "depth", label: "Depth", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "offsets", label: "Offsets", cell: function (p) {
        return num(p.backend_start) + " – " + num(p.end_offset); } },
      { key: "flags", label: "Flags", text: true, cell: function (p) {
        return [p.is_multi_ordered ? "ordered" : null, p.is_ext ? "ext" : null,
                p.is_leader ? "leader" : null].filter(Boolean).join(", "); } }
    ], { sortKey: "partition", sortDir: 1 });
    var partMissing = h("p", { class: "alert warning", id: "partitions-missing", hidden: true });
    append(partSection, [h("h2", null, "Partitions ", h("span", { class: "muted", id: "partition-num" })),
                         partMissing, parts.el]);

    var chanCols = [
      { key: "channel_name", label: "Channel", text: true, sort: true, cell: function (c) {
        return [link("topics/" + enc(name) + "/" + enc(c.channel_name), c.channel_name),
                c.paused ? h("span", { class: "badge paused" }, "paused") : null];
      } },
      { key: "depth", label: "Depth", sort: true },
      { key: "in_flight_count", label: "In-flight", sort: true },
      { key: "deferred_count", label: "Deferred", sort: true },
      { key: "requeue_count", label: "Requeued", sort: true },
      { key: "timeout_count", label: "Timed out", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "rate", label: "Msgs/s", sort: true, cell: function (c) { return rate(c.rate); } },
      { key: "client_count", label: "Clients", sort: true }
    ];
    var channels = new Table("channels", chanCols, { sortKey: "channel_name", sortDir: 1, empty: "No channels." });

    var e2eBox = h("div", { id: "e2e-box" });
    var chName = h("input", { placeholder: "channel", id: "new-channel", required: true });
    var chForm = h("form", { class: "inline", id: "create-channel" },
      h("label", { for: "new-channel" }, "Create a channel"), chName,
      h("button", { class: "primary", type: "submit" }, "Create"));
    chForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var c = chName.value.trim();
      act("Create " + name + "/" + c, api("POST", "api/topics", { topic: name, channel: c }),
        function () { chName.value = ""; refresh(); });
    });

    replace(app, title, adminOnly(actions), ch.el, h("h2", null, "Nodes"), nodes.el, partSection,
      h("h2", null, "Channels"), channels.el, adminOnly(chForm),
      h("h2", null, "End-to-end processing latency"), e2eBox);

    function apply(t) {
      warnOf(t);
      paused = t.paused;
      pauseBtn.textContent = paused ? "Unpause" : "Pause";
      replace(title, "Topic ", h("span", { id: "topic-name" }, name),
        paused ? h("span", { class: "badge paused", id: "topic-paused" }, "paused") : null);
      var e2eCols = e2eColumns(t.e2e_processing_latency);
      nodes.setColumns(nodeCols.concat(e2eCols, [tombCol]));
      var rows = (t.nodes || []).map(function (n) { n._id = n.node; return n; });
      nodes.set(rows.concat(downRows(t, rows)), Object.assign({}, t, { node: "*", _id: "*" }));
      var ms = t.missing_partitions || [];
      partSection.hidden = !t.partition_num;
      document.getElementById("partition-num").textContent = t.partition_num ?
        "(" + t.partition_num + " in the cluster" + (ms.length ? ", " + ms.length + " missing" : "") + ")" : "";
      missingNote(partMissing, t);
      parts.set(partitionRows(t));
      channels.setColumns(chanCols.concat(e2eCols));
      channels.set((t.channels || []).map(function (c) { c._id = c.channel_name; return c; }));
      replace(e2eBox, e2eTable(t.e2e_processing_latency));
    }
    var token = view.token;
    function refresh() {
      return api("GET", "api/topics/" + enc(name)).then(function (t) {
        if (token === view.token) apply(t);
      }, function (err) {
        if (err.status === 404 && token === view.token) { render(); return; }  // deleted meanwhile
        throw err;
      });
    }
    apply(first);
    poll(function () { return Promise.all([refresh(), ch.poll()]); });
  }

  // -- one channel ------------------------------------------------------------------------

  function channelView(topic, name) {
    var path = "api/topics/" + enc(topic) + "/" + enc(name);
    whenTopicExists(topic, path, function (first) { channelPage(topic, name, path, first); });
  }

  function channelPage(topic, name, path, first) {
    var title = h("h1", null, link("topics/" + enc(topic), topic), " / ", name);
    var paused = false;
    var pauseBtn = h("button", { id: "pause-channel" }, "Pause");
    pauseBtn.addEventListener("click", function () {
      var action = paused ? "unpause" : "pause";
      act(action + " " + name, api("POST", path, { action: action }), refresh);
    });
    var actions = h("div", { class: "toolbar", id: "channel-actions" }, pauseBtn,
      h("button", { class: "danger", id: "empty-channel", onclick: confirmThen(
        "Empty channel " + name + "? Its queued messages are dropped.", function () {
          act("empty " + name, api("POST", path, { action: "empty" }), refresh);
        }) }, "Empty"),
      h("button", { class: "danger", id: "delete-channel", onclick: confirmThen(
        "Delete channel " + name + "?", function () {
          act("delete " + name, api("DELETE", path), function () { navigate("topics/" + enc(topic)); });
        }) }, "Delete"));

    // reset to a time, an offset, a count or the end (nsqd's /channel/setoffset)
    var partSel = h("select", { id: "reset-partition", "aria-label": "partition" },
      h("option", { value: "" }, "every partition"));
    var kind = h("select", { id: "reset-kind", "aria-label": "reset to" },
      h("option", { value: "timestamp" }, "a time"),
      h("option", { value: "virtual_queue" }, "a virtual offset"),
      h("option", { value: "msgcount" }, "a message count"),
      h("option", { value: "special" }, "the end (skip all)"));
    var when = h("input", { type: "datetime-local", id: "reset-time", step: "1", "aria-label": "time" });
    var value = h("input", { type: "number", min: "0", id: "reset-value", placeholder: "offset or count",
                             hidden: true, "aria-label": "value" });
    kind.addEventListener("change", function () {
      when.hidden = kind.value !== "timestamp";
      value.hidden = kind.value === "timestamp" || kind.value === "special";
    });
    var resetMissing = h("p", { class: "alert warning", id: "reset-missing", hidden: true });
    var resetForm = h("form", { class: "inline", id: "reset-channel", hidden: true },
      h("label", { for: "reset-kind" }, "Reset this channel to"), kind, when, value,
      h("span", { id: "reset-on", hidden: true }, h("label", { for: "reset-partition" }, " on "), partSel),
      h("button", { class: "danger", type: "submit" }, "Reset"));
    var resetBox = h("div", { id: "reset-box" }, resetMissing, resetForm);
    resetForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var position;
      if (kind.value === "special") position = "special:-1";
      else if (kind.value === "timestamp") {
        var t = when.value ? new Date(when.value).getTime() : NaN;
        if (isNaN(t)) { flash("error", "Choose a time to reset to."); return; }
        position = "timestamp:" + Math.floor(t / 1000);
      } else {
        if (value.value === "" || Number(value.value) < 0) { flash("error", "Give a number."); return; }
        position = kind.value + ":" + Math.floor(Number(value.value));
      }
      var body = { action: "setoffset", position: position };
      if (partSel.value !== "") body.partition = Number(partSel.value);
      if (!window.confirm("Move channel " + name + " to " + position + "?")) return;
      act("reset " + name + " to " + position, api("POST", path, body), refresh);
    });

    var ch = chartSection("Delivered messages/s, depth and in-flight",
      "topic=" + enc(topic) + "&channel=" + enc(name), [
        { label: "msgs/s", field: "message_rate", scale: "rate", color: "#1f6feb" },
        { label: "depth", field: "depth", scale: "count", color: "#d4a72c" },
        { label: "in-flight", field: "in_flight_count", scale: "count", color: "#8250df" }
      ]);

    var nodeCols = [
      { key: "node", label: "Node", text: true, sort: true, cell: function (n) {
        return n.node === "*" ? "Total" : link("nodes/" + enc(n.node), n.hostname + " (" + n.node + ")");
      } },
      { key: "depth", label: "Depth", sort: true },
      { key: "memory_depth", label: "Memory + Disk",
        cell: function (n) { return num(n.memory_depth) + " + " + num(n.backend_depth); } },
      { key: "in_flight_count", label: "In-flight", sort: true },
      { key: "deferred_count", label: "Deferred", sort: true },
      { key: "requeue_count", label: "Requeued", sort: true },
      { key: "timeout_count", label: "Timed out", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "client_count", label: "Clients", sort: true },
      { key: "dead_letter_count", label: "Dead letters", sort: true },
      { key: "expired_count", label: "Expired", sort: true },
      { key: "dropped_count", label: "Dropped", sort: true }
    ];
    var pausedCol = { key: "paused", label: "Paused", cell: function (n) { return n.paused ? "paused" : ""; } };
    var nodes = new Table("channel-nodes", nodeCols.concat([pausedCol]));
    var partSection = h("section", { hidden: true, id: "channel-partitions-section" });
    var parts = new Table("channel-partitions", [
      { key: "partition", label: "Partition", text: true, sort: true, cell: function (p) { return String(p.partition); } },
      { key: "node", label: "Node", text: true, sort: true, cell: lastNodeCell, downCell: lastNodeCell },
      { key: "depth", label: "Depth", sort: true },
      { key: "in_flight_count", label: "In-flight", sort: true },
      { key: "deferred_count", label: "Deferred", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "client_count", label: "Clients", sort: true }
    ], { sortKey: "partition", sortDir: 1 });
    append(partSection, [h("h2", null, "Partitions"), parts.el]);

    var clients = new Table("clients", [
      { key: "hostname", label: "Client host", text: true, wrap: true, sort: true },
      { key: "client_id", label: "Client ID", text: true, wrap: true, sort: true },
      { key: "remote_address", label: "Address", text: true, sort: true },
      { key: "user_agent", label: "User agent", text: true, wrap: true, sort: true, cell: function (c) {
        return c.user_agent || c.version || ""; } },
      { key: "node", label: "nsqd", text: true, sort: true },
      { key: "ready_count", label: "Ready", sort: true },
      { key: "in_flight_count", label: "In-flight", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "finish_count", label: "Finished", sort: true },
      { key: "requeue_count", label: "Requeued", sort: true },
      { key: "connected", label: "Connected", sort: true, cell: function (c) { return since(c.connected); } },
      { key: "attributes", label: "Attributes", text: true, wrap: true, title: "TLS, compression, sample rate",
        cell: clientAttributes },
      { key: "auth_identity", label: "Auth", text: true, wrap: true, cell: function (c) {
        return c.authed ? (c.auth_identity || "yes") : ""; } }
    ], { sortKey: "hostname", sortDir: 1, empty: "No clients connected.", class: "compact" });

    // the next messages, changing nothing (nsqd's /channel/peek); bodies: admins only
    var peekN = h("input", { type: "number", min: "1", max: "1000", value: "10", id: "peek-n",
                             "aria-label": "how many messages" });
    var peekOut = h("div", { id: "peek-out" });
    var peekForm = h("form", { class: "inline", id: "peek-channel" },
      h("label", { for: "peek-n" }, "Peek at the next"), peekN, " messages ",
      h("button", { type: "submit" }, "Peek"));
    peekForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      api("GET", path + "/peek?n=" + enc(peekN.value)).then(function (d) {
        warnOf(d);
        var peeks = d.peeks || [];
        replace(peekOut, peeks.length ? peeks.map(peekTable) :
          h("p", { class: "muted" }, "No node has this channel."));
      }, function (err) { flash("error", "peek failed: " + (err.message || err)); });
    });
    function peekTable(p) {
      var head = h("h3", null, p.node + (p.partition ? ", partition " + p.partition : ""));
      if (p.error) return h("div", { class: "peek" }, head, h("p", { class: "alert warning" }, p.error));
      var rows = (p.messages || []).map(function (m) {
        return h("tr", null, h("td", null, m.id), h("td", null, num(m.attempts)),
          h("td", null, new Date(Math.floor(m.timestamp / 1e6)).toISOString()),
          h("td", null, h("pre", { class: "peek-body" }, m.body)));
      });
      return h("div", { class: "peek" }, head, rows.length ? h("table", { class: "compact" },
        h("thead", null, h("tr", null, h("th", null, "ID"), h("th", null, "Attempt"),
          h("th", null, "Published"), h("th", null, "Body"))), h("tbody", null, rows)) :
        h("p", { class: "muted" }, "Nothing to deliver: in flight, deferred or none."));
    }
    var peekBox = h("section", { id: "peek-box" }, h("h2", null, "Next messages"), peekForm, peekOut);

    // nsqx's channel policy (nsqd's /channel/config): dead letters, TTL, limits
    var policyFields = [
      ["max_attempts", "Max attempts, then a dead letter", null],
      ["dead_letter_topic", "Dead-letter topic", "text"],
      ["dead_letter_format", "Dead-letter format", ["json", "ext"]],
      ["message_ttl_ms", "Message TTL (ms)", null],
      ["max_depth", "Max depth (messages)", null],
      ["max_depth_bytes", "Max depth (bytes)", null],
      ["overflow", "When full", ["refuse", "drop_oldest"]],
      ["max_msgs_per_sec", "Max deliveries/s", null],
      ["max_bytes_per_sec", "Max bytes/s", null]
    ];
    var policyInputs = {};
    var policyRows = policyFields.map(function (f) {
      var id = "policy-" + f[0].replace(/_/g, "-"), input;
      if (Array.isArray(f[2])) {
        input = h("select", { id: id }, f[2].map(function (v) { return h("option", { value: v }, v); }));
      } else if (f[2] === "text") {
        input = h("input", { type: "text", id: id, placeholder: "default" });
      } else {
        input = h("input", { type: "number", min: "0", id: id, placeholder: "0: off" });
      }
      policyInputs[f[0]] = input;
      return h("div", { class: "policy-row" }, h("label", { for: id }, f[1]), input);
    });
    var policyNote = h("p", { class: "muted", id: "policy-note" });
    var replayBtn = h("button", { type: "button", id: "replay-dead-letters" }, "Replay dead letters");
    var policyForm = h("form", { id: "channel-policy" }, policyRows,
      h("div", { class: "policy-row" }, h("button", { type: "submit" }, "Save"), replayBtn));
    policyForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var settings = {};
      policyFields.forEach(function (f) { settings[f[0]] = policyInputs[f[0]].value; });
      act("policy of " + name, api("POST", path, { action: "config", settings: settings }), loadPolicy);
    });
    replayBtn.addEventListener("click", function () {
      if (!window.confirm("Queue the dead letters of " + name + " on it again?")) return;
      act("replay dead letters of " + name, api("POST", path, { action: "replay_dead_letters" }), refresh);
    });
    function loadPolicy() {
      api("GET", path + "/config").then(function (d) {
        var ok = (d.configs || []).filter(function (c) { return !c.error; });
        if (!ok.length) {
          policyNote.textContent = "No node of this channel has nsqx's channel policy.";
          return;
        }
        policyFields.forEach(function (f) {
          var v = ok[0][f[0]];
          policyInputs[f[0]].value = (v === 0 || v === "") && !Array.isArray(f[2]) ? "" : String(v);
        });
        policyNote.textContent = "Dead letters go to " + ok[0].dead_letters_to + ". Empty or 0: off." +
          (ok.length < (d.configs || []).length ? " Some nodes have no policy (not nsqx)." : "");
      }, function () { policyNote.textContent = "The policy could not be read."; });
    }
    var policyBox = h("section", { id: "policy-box" },
      h("h2", null, "Dead letters, TTL and limits"), policyNote, policyForm);
    if (CFG.is_admin) loadPolicy();

    var e2eBox = h("div", { id: "e2e-box" });
    var missing = h("p", { class: "alert warning", id: "not-found", hidden: true },
      "This channel does not exist (yet, or any more) on any node.");
    var acts = h("div", null, adminOnly(actions), adminOnly(resetBox));
    replace(app, title, missing, acts, ch.el,
      h("h2", null, "Nodes"), nodes.el, partSection,
      h("h2", null, "Clients ", h("span", { class: "muted", id: "client-count" })), clients.el,
      h("h2", null, "End-to-end processing latency"), e2eBox, adminOnly(peekBox), adminOnly(policyBox));

    var knownParts = "";
    function setPartitions(c) {
      var present = {};
      (c.partitions || []).forEach(function (p) { present[p.partition] = true; });
      var ms = c.missing_partitions || [];
      var ids = [];
      for (var i = 0; i < (c.partition_num || 0); i++) ids.push(i);
      var key = ids.join(",") + "|" + ms.map(function (m) { return m.partition + ":" + m.node + ":" + m.reason; }).join(",");
      resetMissing.hidden = !ms.length;
      if (ms.length) {
        var avail = ids.filter(function (p) { return present[p]; });
        missingNote(resetMissing, c, ", so a reset cannot move " + (ms.length > 1 ? "them" : "it") +
          " (\u201cevery partition\u201d resets only " + (avail.length ? avail.join(", ") : "none") + ")");
      }
      if (key === knownParts) return;
      knownParts = key;
      var keep = partSel.value;
      var missingBy = {};
      ms.forEach(function (m) { missingBy[m.partition] = m; });
      replace(partSel, h("option", { value: "" }, ms.length ?
          "every answering partition (" + (ids.length - ms.length) + " of " + ids.length + ")" : "every partition"),
        ids.map(function (p) {
          var m = missingBy[p];
          return h("option", { value: String(p), disabled: !!m },
            "partition " + p + (m ? " \u2013 missing" + (m.node ? " (last on " + m.node + ")" : "") : ""));
        }));
      partSel.value = missingBy[keep] ? "" : keep;
      document.getElementById("reset-on").hidden = !ids.length;
    }

    function apply(c, err) {
      if (err) {  // CHANNEL_NOT_FOUND: keep watching, a consumer may be about to create it
        missing.hidden = false;
        acts.hidden = true;
        return;
      }
      warnOf(c);
      missing.hidden = true;
      acts.hidden = false;
      paused = c.paused;
      pauseBtn.textContent = paused ? "Unpause" : "Pause";
      replace(title, link("topics/" + enc(topic), topic), " / ", h("span", { id: "channel-name" }, name),
        paused ? h("span", { class: "badge paused", id: "channel-paused" }, "paused") : null);
      resetForm.hidden = !c.setoffset_supported;
      if (!c.setoffset_supported) resetMissing.hidden = true;
      nodes.setColumns(nodeCols.concat(e2eColumns(c.e2e_processing_latency), [pausedCol]));
      var rows = (c.nodes || []).map(function (n) { n._id = n.node; return n; });
      nodes.set(rows.concat(downRows(c, rows)), Object.assign({}, c, { node: "*", _id: "*" }));
      partSection.hidden = !c.partition_num;
      parts.set(partitionRows(c));
      if (c.setoffset_supported) setPartitions(c);
      var cs = (c.clients || []).map(function (x, i) { x._id = x.client_id + "@" + x.remote_address + "#" + i; return x; });
      document.getElementById("client-count").textContent = "(" + cs.length + ")";
      clients.set(cs);
      replace(e2eBox, e2eTable(c.e2e_processing_latency));
    }
    var token = view.token;
    function refresh() {
      return api("GET", path).then(function (c) { if (token === view.token) apply(c); }, function (err) {
        if (token !== view.token) return;
        if (err.status === 404 && /TOPIC_NOT_FOUND/.test(err.message)) { render(); return; }
        if (err.status === 404) { apply(null, err); return; }
        throw err;
      });
    }
    apply(first, first ? null : true);
    poll(function () { return Promise.all([refresh(), ch.poll()]); });
  }

  function clientAttributes(c) {
    var out = [];
    if (c.tls) out.push((c.tls_version || "TLS") + (c.tls_negotiated_protocol_is_mutual ? " (mutual)" : ""));
    if (c.snappy) out.push("snappy");
    if (c.deflate) out.push("deflate");
    if (c.sample_rate) out.push("sample " + c.sample_rate + "%");
    return out.join(", ");
  }

  // -- nodes ----------------------------------------------------------------------------

  function health(text) {
    var ok = text === "OK";
    var down = /^NOT ANSWERING/.test(text || "");
    return h("span", { class: "badge " + (ok ? "ok" : "bad"), "data-health": ok ? "ok" : (down ? "down" : "bad"),
                       title: ok ? null : text }, ok ? text : (down ? "not answering" : text || "?"));
  }

  function topicList(n) {
    return (n.topics || []).map(function (t, i) {
      return [i ? " " : null, h("span", { class: "topic-name" + (t.tombstoned ? " tombstoned" : "") },
        link("topics/" + enc(t.topic), t.topic))];
    });
  }

  function nodesView() {
    var nsqds = new Table("nodes", [
      { key: "hostname", label: "Hostname", text: true, sort: true, cell: function (n) {
        return link("nodes/" + enc(n.broadcast_address + ":" + n.http_port), n.hostname); } },
      { key: "broadcast_address", label: "Broadcast address", text: true, sort: true },
      { key: "tcp_port", label: "TCP port", sort: true, cell: function (n) { return String(n.tcp_port); } },
      { key: "http_port", label: "HTTP port", sort: true, cell: function (n) { return String(n.http_port); } },
      { key: "version", label: "Version", text: true, sort: true, cell: function (n) {
        return [n.version, n.out_of_date ? h("span", { class: "badge warn" }, "out of date") : null]; } },
      { key: "health", label: "Health", text: true, sort: true, cell: function (n) { return health(n.health); } },
      { key: "remote_addresses", label: "nsqlookupd connections", text: true, wrap: true, cell: function (n) {
        return (n.remote_addresses || []).map(function (a, i) { return [i ? h("br") : null, a]; }); } },
      { key: "topic_count", label: "Topics", text: true, wrap: true, sort: true, cell: function (n) {
        return [h("span", { class: "muted" }, num(n.topic_count) + " "), topicList(n)]; } },
      { key: "tombstoned", label: "Tombstoned", text: true, wrap: true, cell: function (n) {
        return n.topics.filter(function (t) { return t.tombstoned; }).map(function (t) { return t.topic; }).join(", "); } }
    ], { sortKey: "hostname", sortDir: 1, empty: "No nsqd found." });
    var lookupds = new Table("lookupds", [
      { key: "address", label: "nsqlookupd", text: true, sort: true },
      { key: "version", label: "Version", text: true },
      { key: "health", label: "Health", text: true, cell: function (l) { return health(l.health); } }
    ], { sortKey: "address", sortDir: 1, empty: "No nsqlookupd (the admin reads nsqd directly)." });
    replace(app, h("h1", null, "Nodes"), h("h2", null, "nsqd"), nsqds.el,
      h("h2", null, "nsqlookupd"), lookupds.el);
    poll(function () {
      return Promise.all([
        api("GET", "api/nodes").then(function (d) {
          warnOf(d);
          nsqds.set((d.nodes || []).map(function (n) {
            n._id = n.broadcast_address + ":" + n.http_port;
            n.topic_count = (n.topics || []).filter(function (t) { return !t.tombstoned; }).length;
            return n;
          }));
        }),
        api("GET", "api/lookupds").then(function (d) {
          lookupds.set((d.lookupds || []).map(function (l) { l._id = l.address; return l; }));
        })
      ]);
    });
  }

  function nodeView(node) {
    var head = h("h1", null, "Node ", h("span", { id: "node-name" }, node));
    var summary = h("p", { class: "muted", id: "node-summary" });
    var down = h("p", { class: "alert warning", id: "node-down", hidden: true });
    var lookupdsEl = h("p", { class: "muted", id: "node-lookupds" });
    var tombs = h("p", { id: "node-tombstones" });
    var topics = new Table("node-topics", [
      { key: "name", label: "Topic / channel", text: true, sort: true, cell: function (r) {
        return r.channel ? ["↳ ", link("topics/" + enc(r.topic) + "/" + enc(r.channel), r.channel)]
          : link("topics/" + enc(r.topic), r.topic); } },
      { key: "depth", label: "Depth" },
      { key: "in_flight_count", label: "In-flight" },
      { key: "deferred_count", label: "Deferred" },
      { key: "requeue_count", label: "Requeued" },
      { key: "timeout_count", label: "Timed out" },
      { key: "message_count", label: "Messages" },
      { key: "client_count", label: "Clients" },
      { key: "paused", label: "Paused", cell: function (r) { return r.paused ? "paused" : ""; } }
    ], { sortKey: "name", sortDir: 1, empty: "No topics on this node." });
    var clients = new Table("node-clients", [
      { key: "hostname", label: "Client host", text: true, wrap: true, sort: true },
      { key: "client_id", label: "Client ID", text: true, wrap: true, sort: true },
      { key: "remote_address", label: "Address", text: true, sort: true },
      { key: "where", label: "Topic / channel", text: true, wrap: true, sort: true, cell: function (c) {
        return link("topics/" + enc(c.topic_name) + "/" + enc(c.channel_name), c.topic_name + " / " + c.channel_name); } },
      { key: "user_agent", label: "User agent", text: true, wrap: true, sort: true, cell: function (c) {
        return c.user_agent || c.version || ""; } },
      { key: "ready_count", label: "Ready", sort: true },
      { key: "in_flight_count", label: "In-flight", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "finish_count", label: "Finished", sort: true },
      { key: "requeue_count", label: "Requeued", sort: true },
      { key: "connected", label: "Connected", sort: true, cell: function (c) { return since(c.connected); } },
      { key: "attributes", label: "Attributes", text: true, wrap: true, cell: clientAttributes },
      { key: "auth_identity", label: "Auth", text: true, wrap: true, cell: function (c) {
        return c.authed ? (c.auth_identity || "yes") : ""; } }
    ], { sortKey: "hostname", sortDir: 1, empty: "No clients connected.", class: "compact" });
    replace(app, head, summary, down, lookupdsEl, h("h2", null, "Tombstones"), tombs,
      h("h2", null, "Topics and channels"), topics.el,
      h("h2", null, "Clients ", h("span", { class: "muted", id: "node-client-count" })), clients.el);
    poll(function () {
      return api("GET", "api/nodes/" + enc(node)).then(function (d) {
        warnOf(d);
        summary.textContent = d.hostname + " · nsqd " + d.version + " · " + num(d.total_messages) +
          " messages · " + num(d.total_clients) + " clients";
        var me = (d.not_answering || []).filter(function (x) { return x.node === node; })[0];
        down.hidden = !me;
        if (me) down.textContent = "This nsqd is not answering (" + me.error + "): its topics and clients are not shown.";
        lookupdsEl.textContent = (d.remote_addresses || []).length ?
          "nsqlookupd connections: " + d.remote_addresses.join(", ") : "";
        var ts = d.tombstones || [];
        replace(tombs, ts.length ? ts.map(function (t, i) {
          return [i ? ", " : null, link("topics/" + enc(t), t)];
        }) : h("span", { class: "muted" }, "No topic is tombstoned on this node."));
        var rows = [];
        (d.topics || []).forEach(function (t) {
          rows.push({ _id: t.topic_name, name: t.topic_name, topic: t.topic_name, depth: t.depth,
                      message_count: t.message_count, paused: t.paused });
          (t.channels || []).forEach(function (c) {
            rows.push({ _id: t.topic_name + "/" + c.channel_name, name: t.topic_name + "\u0000" + c.channel_name,
                        topic: t.topic_name, channel: c.channel_name, depth: c.depth,
                        in_flight_count: c.in_flight_count, deferred_count: c.deferred_count,
                        requeue_count: c.requeue_count, timeout_count: c.timeout_count,
                        message_count: c.message_count, client_count: c.client_count, paused: c.paused });
          });
        });
        topics.set(rows);
        var cs = (d.clients || []).map(function (c, i) {
          c._id = c.client_id + "@" + c.remote_address + "#" + i;
          c.where = c.topic_name + "/" + c.channel_name;
          return c;
        });
        document.getElementById("node-client-count").textContent = "(" + cs.length + ")";
        clients.set(cs);
      }, function (err) {
        if (err.status === 404) { summary.textContent = "No such node in the cluster."; return; }
        throw err;
      });
    });
  }

  // -- counter --------------------------------------------------------------------------

  function counterView() {
    var big = h("div", { class: "counter", id: "counter" }, "–");
    var sub = h("p", { class: "muted", id: "counter-rate" }, "messages delivered on all channels");
    replace(app, h("h1", null, "Messages processed"), big, sub);
    var last = null;
    poll(function () {
      return api("GET", "api/counter").then(function (d) {
        warnOf(d);
        var total = 0;
        Object.keys(d.stats || {}).forEach(function (k) { total += d.stats[k].message_count; });
        var now = Date.now();
        big.textContent = num(total);
        if (last && now > last.t) {
          sub.textContent = rate(Math.max(0, (total - last.n) * 1000 / (now - last.t))) + " msgs/s · messages delivered on all channels";
        }
        last = { t: now, n: total };
      });
    });
  }

  // -- lookup ---------------------------------------------------------------------------

  function lookupView() {
    var list = h("div", { id: "inactive" });
    replace(app, h("h1", null, "Lookup"),
      h("p", { class: "muted" }, "Topics and channels that nsqlookupd knows but no nsqd produces."), list);
    if (!CFG.nsqlookupd.length) {
      replace(list, h("p", { class: "muted" }, "The admin reads nsqd directly (no --lookupd-http-address)."));
      return;
    }
    poll(function () {
      return api("GET", "api/topics?inactive=true").then(function (d) {
        warnOf(d);
        var names = Object.keys(d.topics || {}).sort();
        if (!names.length) { replace(list, h("p", { class: "muted" }, "None.")); return; }
        replace(list, h("ul", null, names.map(function (t) {
          return h("li", null, link("topics/" + enc(t), t), d.topics[t].length ? " (" + d.topics[t].join(", ") + ")" : "");
        })));
      });
    });
  }

  // -- start ----------------------------------------------------------------------------

  var where = CFG.nsqlookupd.length ? "nsqlookupd " + CFG.nsqlookupd.join(", ") : "nsqd " + CFG.nsqd.join(", ");
  document.getElementById("cluster").textContent = where + (CFG.is_admin ? "" : " · read-only");
  document.getElementById("footer").textContent = "nsqx nsqadmin · NSQ " + CFG.version;
  render();
})();
