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
    var self = this;
    this.columns = columns;
    this.sortKey = opts.sortKey || null;
    this.sortDir = opts.sortDir || 1;
    this.rows = [];
    this.filter = null;
    this.tbody = h("tbody");
    this.foot = h("tfoot");
    var ths = columns.map(function (c) {
      var th = h("th", { class: (c.text ? "text " : "") + (c.sort ? "sortable" : ""),
                         "data-col": c.key, scope: "col" }, c.label);
      if (c.sort) {
        th.addEventListener("click", function () {
          if (self.sortKey === c.key) self.sortDir = -self.sortDir;
          else { self.sortKey = c.key; self.sortDir = c.text ? 1 : -1; }
          self.draw();
        });
      }
      return th;
    });
    this.ths = ths;
    this.table = h("table", { id: id }, h("thead", null, h("tr", null, ths)), this.tbody, this.foot);
    this.el = h("div", { class: "scroll" }, this.table);
    this.empty = opts.empty || "none";
  }

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

  Table.prototype.row = function (r, cls) {
    return h("tr", { class: cls, "data-row": r._id !== undefined ? r._id : null },
      this.columns.map(function (c) {
        var v = c.cell ? c.cell(r) : r[c.key];
        if (typeof v === "number") v = num(v);
        return h("td", { class: c.text ? "text" : null, "data-col": c.key }, v);
      }));
  };

  // -- charts ---------------------------------------------------------------------------

  function chart(container, series) {
    if (typeof uPlot === "undefined") return null;
    var width = Math.max(320, container.clientWidth || 900);
    var opts = {
      width: width, height: 220,
      scales: { x: { time: true, range: function (u, min, max) {
        // one point alone would stretch the axis over years: show its last minute
        return min === max ? [min - 60, max + 1] : [min, max];
      } }, rate: {}, count: {} },
      series: [{}].concat(series.map(function (s) {
        return { label: s.label, stroke: s.color, width: 2, scale: s.scale,
                 value: function (u, v) { return v === null ? "–" : (s.scale === "rate" ? rate(v) : num(v)); },
                 spanGaps: false };
      })),
      axes: [{}, { scale: "rate", label: "msgs/s" },
             { scale: "count", side: 1, label: "messages", grid: { show: false } }],
      legend: { live: true }
    };
    var data = [[]].concat(series.map(function () { return []; }));
    var u = new uPlot(opts, data, container);
    view.charts.push(u);
    return u;
  }

  function historyPoller(u, container, query, fields) {
    return function () {
      return api("GET", "api/history?" + query).then(function (data) {
        var pts = data.points || [];
        container.setAttribute("data-points", String(pts.length));
        if (!u) return;
        var cols = [pts.map(function (p) { return p.ts; })];
        fields.forEach(function (f) { cols.push(pts.map(function (p) { return p[f]; })); });
        u.setData(cols);
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
      "End-to-end latency is not measured (nsqd --e2e-processing-latency-percentile).");
    return h("table", { id: "e2e" },
      h("thead", null, h("tr", null, h("th", { class: "text" }, "Percentile"),
        h("th", null, "Average"), h("th", null, "Min (node)"), h("th", null, "Max (node)"),
        h("th", null, "Samples"))),
      h("tbody", null, pcts.map(function (p) {
        return h("tr", { "data-row": String(p.quantile) },
          h("td", { class: "text" }, quantile(p.quantile)),
          h("td", { "data-col": "average" }, nanos(p.average)),
          h("td", null, nanos(p.min)), h("td", null, nanos(p.max)), h("td", null, num(p.count)));
      })));
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

  // -- one topic ------------------------------------------------------------------------

  function topicView(name) {
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

    var nodes = new Table("topic-nodes", [
      { key: "node", label: "Node", text: true, sort: true, cell: function (n) {
        return n.node === "*" ? "Total" : link("nodes/" + enc(n.node), n.hostname + " (" + n.node + ")");
      } },
      { key: "depth", label: "Depth", sort: true },
      { key: "memory_depth", label: "Memory + Disk",
        cell: function (n) { return num(n.memory_depth) + " + " + num(n.backend_depth); } },
      { key: "message_count", label: "Messages", sort: true },
      { key: "channels", label: "Channels", cell: function (n) { return num((n.channels || []).length); } },
      { key: "paused", label: "Paused", cell: function (n) { return n.paused ? "paused" : ""; } },
      { key: "tombstone", label: "", cell: function (n) {
        if (n.node === "*" || !CFG.is_admin || !CFG.nsqlookupd.length) return "";
        return h("button", { class: "danger tombstone", onclick: confirmThen(
          "Tombstone " + name + " on " + n.node + "? The topic is deleted there.", function () {
            act("tombstone " + n.node, api("DELETE", "api/nodes/" + enc(n.node), { topic: name }), refresh);
          }) }, "Tombstone");
      } }
    ], { empty: "No node has this topic." });

    var partSection = h("section", { id: "partitions-section", hidden: true });
    var parts = new Table("partitions", [
      { key: "partition", label: "Partition", text: true, sort: true, cell: function (p) { return String(p.partition); } },
      { key: "node", label: "Node", text: true, sort: true },
      { key: "depth", label: "Depth", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "offsets", label: "Offsets", cell: function (p) {
        return num(p.backend_start) + " – " + num(p.end_offset); } },
      { key: "flags", label: "Flags", text: true, cell: function (p) {
        return [p.is_multi_ordered ? "ordered" : null, p.is_ext ? "ext" : null,
                p.is_leader ? "leader" : null].filter(Boolean).join(", "); } }
    ], { sortKey: "partition", sortDir: 1 });
    append(partSection, [h("h2", null, "Partitions ", h("span", { class: "muted", id: "partition-num" })), parts.el]);

    var channels = new Table("channels", [
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
    ], { sortKey: "channel_name", sortDir: 1, empty: "No channels." });

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

    function refresh() {
      return api("GET", "api/topics/" + enc(name)).then(function (t) {
        warnOf(t);
        paused = t.paused;
        pauseBtn.textContent = paused ? "Unpause" : "Pause";
        replace(title, "Topic ", h("span", { id: "topic-name" }, name),
          paused ? h("span", { class: "badge paused", id: "topic-paused" }, "paused") : null);
        nodes.set((t.nodes || []).map(function (n) { n._id = n.node; return n; }),
          Object.assign({}, t, { node: "*", _id: "*" }));
        var ps = (t.partitions || []).map(function (p) { p._id = p.partition + "@" + p.node; return p; });
        partSection.hidden = !t.partition_num;
        document.getElementById("partition-num").textContent = t.partition_num ? "(" + t.partition_num + " in the cluster)" : "";
        parts.set(ps);
        channels.set((t.channels || []).map(function (c) { c._id = c.channel_name; return c; }));
        replace(e2eBox, e2eTable(t.e2e_processing_latency));
      });
    }
    poll(function () { return Promise.all([refresh(), ch.poll()]); });
  }

  // -- one channel ------------------------------------------------------------------------

  function channelView(topic, name) {
    var path = "api/topics/" + enc(topic) + "/" + enc(name);
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
    var resetForm = h("form", { class: "inline", id: "reset-channel", hidden: true },
      h("label", { for: "reset-kind" }, "Reset this channel to"), kind, when, value,
      h("span", { id: "reset-on", hidden: true }, h("label", { for: "reset-partition" }, " on "), partSel),
      h("button", { class: "danger", type: "submit" }, "Reset"));
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

    var cols = [
      { key: "depth", label: "Depth", sort: true },
      { key: "memory_depth", label: "Memory + Disk",
        cell: function (n) { return num(n.memory_depth) + " + " + num(n.backend_depth); } },
      { key: "in_flight_count", label: "In-flight", sort: true },
      { key: "deferred_count", label: "Deferred", sort: true },
      { key: "requeue_count", label: "Requeued", sort: true },
      { key: "timeout_count", label: "Timed out", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "client_count", label: "Clients", sort: true }
    ];
    var nodes = new Table("channel-nodes", [
      { key: "node", label: "Node", text: true, sort: true, cell: function (n) {
        return n.node === "*" ? "Total" : link("nodes/" + enc(n.node), n.hostname + " (" + n.node + ")");
      } }].concat(cols, [
      { key: "paused", label: "Paused", cell: function (n) { return n.paused ? "paused" : ""; } }]));
    var partSection = h("section", { hidden: true, id: "channel-partitions-section" });
    var parts = new Table("channel-partitions", [
      { key: "partition", label: "Partition", text: true, sort: true, cell: function (p) { return String(p.partition); } },
      { key: "node", label: "Node", text: true, sort: true },
      { key: "depth", label: "Depth", sort: true },
      { key: "in_flight_count", label: "In-flight", sort: true },
      { key: "deferred_count", label: "Deferred", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "client_count", label: "Clients", sort: true }
    ], { sortKey: "partition", sortDir: 1 });
    append(partSection, [h("h2", null, "Partitions"), parts.el]);

    var clients = new Table("clients", [
      { key: "hostname", label: "Client host", text: true, sort: true, cell: function (c) {
        return h("span", { class: "wrap" }, c.hostname); } },
      { key: "client_id", label: "Client ID", text: true, sort: true },
      { key: "remote_address", label: "Address", text: true, sort: true },
      { key: "user_agent", label: "User agent", text: true, sort: true, cell: function (c) {
        return h("span", { class: "wrap" }, c.user_agent || c.version || ""); } },
      { key: "node", label: "nsqd", text: true, sort: true },
      { key: "ready_count", label: "Ready", sort: true },
      { key: "in_flight_count", label: "In-flight", sort: true },
      { key: "message_count", label: "Messages", sort: true },
      { key: "finish_count", label: "Finished", sort: true },
      { key: "requeue_count", label: "Requeued", sort: true },
      { key: "connected", label: "Connected", sort: true, cell: function (c) { return since(c.connected); } },
      { key: "sample_rate", label: "Sample", cell: function (c) { return c.sample_rate ? c.sample_rate + "%" : ""; } },
      { key: "tls", label: "TLS", text: true, cell: function (c) {
        return c.tls ? (c.tls_version || "TLS") + (c.tls_negotiated_protocol_is_mutual ? " (mutual)" : "") : ""; } },
      { key: "compression", label: "Compression", text: true, cell: function (c) {
        return c.snappy ? "snappy" : c.deflate ? "deflate" : ""; } },
      { key: "auth_identity", label: "Auth", text: true, cell: function (c) {
        return c.authed ? (c.auth_identity || "yes") : ""; } }
    ], { sortKey: "hostname", sortDir: 1, empty: "No clients connected." });

    var e2eBox = h("div", { id: "e2e-box" });
    var missing = h("p", { class: "alert warning", id: "not-found", hidden: true },
      "This channel does not exist (yet, or any more) on any node.");
    replace(app, title, missing, adminOnly(actions), adminOnly(resetForm), ch.el,
      h("h2", null, "Nodes"), nodes.el, partSection,
      h("h2", null, "Clients ", h("span", { class: "muted", id: "client-count" })), clients.el,
      h("h2", null, "End-to-end processing latency"), e2eBox);

    var knownParts = "";
    function refresh() {
      return api("GET", path).then(function (c) {
        warnOf(c);
        paused = c.paused;
        pauseBtn.textContent = paused ? "Unpause" : "Pause";
        replace(title, link("topics/" + enc(topic), topic), " / ", h("span", { id: "channel-name" }, name),
          paused ? h("span", { class: "badge paused", id: "channel-paused" }, "paused") : null);
        resetForm.hidden = !c.setoffset_supported;
        nodes.set((c.nodes || []).map(function (n) { n._id = n.node; return n; }),
          Object.assign({}, c, { node: "*", _id: "*" }));
        var ps = (c.partitions || []).map(function (p) { p._id = p.partition + "@" + p.node; return p; });
        partSection.hidden = !c.partition_num;
        parts.set(ps);
        var ids = ps.map(function (p) { return p.partition; }).filter(function (p, i, a) { return a.indexOf(p) === i; });
        if (ids.join(",") !== knownParts) {
          knownParts = ids.join(",");
          var keep = partSel.value;
          replace(partSel, h("option", { value: "" }, "every partition"),
            ids.map(function (p) { return h("option", { value: String(p) }, "partition " + p); }));
          partSel.value = keep;
          document.getElementById("reset-on").hidden = !ids.length;
        }
        var cs = (c.clients || []).map(function (x, i) { x._id = x.client_id + "@" + x.remote_address + "#" + i; return x; });
        document.getElementById("client-count").textContent = "(" + cs.length + ")";
        clients.set(cs);
        replace(e2eBox, e2eTable(c.e2e_processing_latency));
        missing.hidden = true;
      }, function (err) {
        if (err.status === 404) {
          // keep watching: a consumer may be about to create it
          missing.hidden = false;
          return;
        }
        throw err;
      });
    }
    poll(function () { return Promise.all([refresh(), ch.poll()]); });
  }

  // -- nodes ----------------------------------------------------------------------------

  function health(text) {
    var ok = text === "OK";
    return h("span", { class: "badge " + (ok ? "ok" : "bad"), "data-health": ok ? "ok" : "bad" }, text || "?");
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
      { key: "topic_count", label: "Topics", sort: true },
      { key: "tombstoned", label: "Tombstoned", text: true, cell: function (n) {
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
            n.topic_count = (n.topics || []).length;
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
    replace(app, head, summary, topics.el);
    poll(function () {
      return api("GET", "api/nodes/" + enc(node)).then(function (d) {
        warnOf(d);
        summary.textContent = d.hostname + " · nsqd " + d.version + " · " + num(d.total_messages) +
          " messages · " + num(d.total_clients) + " clients";
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
