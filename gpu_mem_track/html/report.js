/* gpu_mem_track HTML report: draws the data embedded in <script id="gmt-data">.
   No network access, no libraries. Sets <body data-status="ready"> when done; any error
   goes to <body data-errors> and the #gmt-errors box. With the URL fragment #selftest it
   sorts the line table, zooms and hovers the timeline, and writes the outcome into
   <body data-selftest> (the headless browser test reads it). */
(function () {
  "use strict";
  var errors = [];
  function fail(message) {
    errors.push(String(message));
    document.body.setAttribute("data-errors", errors.join(" | "));
    var box = document.getElementById("gmt-errors");
    if (box) { box.textContent = errors.join("\n"); box.style.display = "block"; }
  }
  window.onerror = function (message, source, line) { fail(message + " (line " + line + ")"); };

  var SVGNS = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f6fb2", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d"];
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  var NUMBER = /^(>=)?[-+]?[\d.]+( (B|KiB|MiB|GiB|TiB))?$|^n\/a$/;  // right-aligned cells

  function bytes(n, signed) {
    if (n === null || n === undefined) return "n/a";
    var sign = n < 0 ? "-" : (signed ? "+" : ""), m = Math.abs(n), p = 0;
    if (m < 1024) return sign + m + " B";
    while (m >= 1024 && p < UNITS.length - 1) { m /= 1024; p++; }
    return sign + m.toFixed(2) + " " + UNITS[p];
  }
  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function svg(tag, attrs) {
    var node = document.createElementNS(SVGNS, tag);
    for (var k in attrs || {}) node.setAttribute(k, attrs[k]);
    return node;
  }
  function section(title, id) {
    var box = el("section", { id: id });
    box.appendChild(el("h2", {}, title));
    document.getElementById("gmt-main").appendChild(box);
    return box;
  }

  /* ---- summary ---------------------------------------------------------------------- */
  function summary(data) {
    var box = section("Runs", "gmt-runs");
    var rows = data.runs.map(function (r, i) {
      return [{ text: "\u25A0 " + r.name, color: COLORS[i % COLORS.length] }, r.kind, r.device || "?",
        r.memory_source || "?", bytes(r.peak), String(r.events), String(r.lines.length), r.path];
    });
    box.appendChild(plainTable(["run", "kind", "device", "memory", "peak", "events", "lines", "path"], rows));
    data.notes.forEach(function (n) { box.appendChild(el("p", { "class": "note" }, n)); });
  }
  function plainTable(headers, rows) {
    var table = el("table", { "class": "plain" }), head = el("tr");
    headers.forEach(function (h) { head.appendChild(el("th", {}, h)); });
    table.appendChild(el("thead")).appendChild(head);
    var body = table.appendChild(el("tbody"));
    rows.forEach(function (row) {
      var tr = body.appendChild(el("tr"));
      row.forEach(function (cell) {
        var td = tr.appendChild(el("td", {}, typeof cell === "object" && cell ? cell.text : cell));
        if (typeof cell === "string" && NUMBER.test(cell)) td.className = "num";
        if (cell && cell.color) td.style.color = cell.color;
      });
    });
    return table;
  }

  /* ---- timeline --------------------------------------------------------------------- */
  var W = 1100, H = 320, M = { left: 80, right: 20, top: 12, bottom: 34 };
  function Chart(box, series, labels) {
    this.series = series; this.labels = labels;
    var all = [];
    series.forEach(function (s) { s.points.forEach(function (p) { all.push(p); }); });
    this.full = [Math.min.apply(null, all.map(function (p) { return p[0]; })),
                 Math.max.apply(null, all.map(function (p) { return p[0]; }))];
    if (this.full[0] === this.full[1]) this.full[1] = this.full[0] + 1;
    this.domain = this.full.slice();
    this.root = svg("svg", { viewBox: "0 0 " + W + " " + H, "class": "chart", id: "gmt-chart" });
    box.appendChild(this.root);
    this.tip = box.appendChild(el("div", { "class": "tip", id: "gmt-tip" }));
    box.appendChild(el("p", { "class": "hint" },
      "Drag across the chart to zoom into a time range; double-click to see the whole run. " +
      "Hover for the line and the memory after it; dashed lines are track() stamps."));
    this.bind();
    this.draw();
  }
  Chart.prototype.x = function (t) {
    return M.left + (t - this.domain[0]) / (this.domain[1] - this.domain[0]) * (W - M.left - M.right);
  };
  Chart.prototype.t = function (x) {
    return this.domain[0] + (x - M.left) / (W - M.left - M.right) * (this.domain[1] - this.domain[0]);
  };
  Chart.prototype.visible = function (s) {
    var d = this.domain;
    return s.points.filter(function (p) { return p[0] >= d[0] && p[0] <= d[1]; });
  };
  Chart.prototype.draw = function () {
    var self = this, root = this.root;
    while (root.firstChild) root.removeChild(root.firstChild);
    var top = 0;
    this.series.forEach(function (s) { self.visible(s).forEach(function (p) { top = Math.max(top, p[1]); }); });
    top = top || 1;
    this.top = top * 1.05;
    var y = function (v) { return H - M.bottom - v / self.top * (H - M.top - M.bottom); };
    this.y = y;
    for (var i = 0; i <= 4; i++) {
      var v = self.top * i / 4, yy = y(v);
      root.appendChild(svg("line", { x1: M.left, x2: W - M.right, y1: yy, y2: yy, "class": "grid" }));
      var label = root.appendChild(svg("text", { x: M.left - 6, y: yy + 4, "text-anchor": "end", "class": "axis" }));
      label.textContent = bytes(Math.round(v));
      var t = this.domain[0] + (this.domain[1] - this.domain[0]) * i / 4;
      var anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
      var tl = root.appendChild(svg("text", { x: this.x(t), y: H - 12, "text-anchor": anchor, "class": "axis" }));
      tl.textContent = t.toFixed(3) + " s";
    }
    this.series.forEach(function (s) {
      var pts = self.visible(s);
      if (!pts.length) return;
      // A step: memory is read at the end of each line and holds until the next reading.
      var d = pts.map(function (p, k) {
        var x = self.x(p[0]).toFixed(1), yy = y(p[1]).toFixed(1);
        return k ? "H" + x + "V" + yy : "M" + x + "," + yy;
      });
      root.appendChild(svg("path", { d: d.join(""), stroke: s.color, "class": "series" }));
    });
    this.labels.forEach(function (l) {
      if (l[0] < self.domain[0] || l[0] > self.domain[1]) return;
      var mark = root.appendChild(svg("line", { x1: self.x(l[0]), x2: self.x(l[0]), y1: M.top, y2: H - M.bottom, "class": "mark" }));
      mark.appendChild(svg("title")).textContent = (l[2] || "track()") + " at " + l[3];
    });
    this.band = root.appendChild(svg("rect", { y: M.top, height: H - M.top - M.bottom, width: 0, "class": "band" }));
    this.cursor = root.appendChild(svg("line", { y1: M.top, y2: H - M.bottom, "class": "cursor" }));
    root.setAttribute("data-points", String(this.series.reduce(function (n, s) { return n + self.visible(s).length; }, 0)));
  };
  Chart.prototype.svgX = function (event) {
    var box = this.root.getBoundingClientRect();
    return (event.clientX - box.left) / box.width * W;
  };
  Chart.prototype.nearest = function (t) {
    var best = null;
    this.series.forEach(function (s) {
      s.points.forEach(function (p) {
        var d = Math.abs(p[0] - t);
        if (!best || d < best.d || (d === best.d && p[1] > best.p[1])) best = { d: d, p: p, s: s };
      });
    });
    return best;
  };
  Chart.prototype.hover = function (x) {
    var hit = this.nearest(this.t(x));
    if (!hit) return;
    var p = hit.p;
    this.cursor.setAttribute("x1", this.x(p[0])); this.cursor.setAttribute("x2", this.x(p[0]));
    this.tip.textContent = hit.s.name + " | " + p[0].toFixed(4) + " s | " + bytes(p[1]) + " | " + (p[2] || "");
  };
  Chart.prototype.zoom = function (t0, t1) {
    if (Math.abs(t1 - t0) <= 0) return;
    this.domain = [Math.min(t0, t1), Math.max(t0, t1)];
    this.draw();
  };
  Chart.prototype.reset = function () { this.domain = this.full.slice(); this.draw(); };
  Chart.prototype.bind = function () {
    var self = this, start = null;
    this.root.addEventListener("mousedown", function (e) { start = self.svgX(e); e.preventDefault(); });
    this.root.addEventListener("mousemove", function (e) {
      var x = self.svgX(e);
      self.hover(x);
      if (start !== null) {
        self.band.setAttribute("x", Math.min(start, x));
        self.band.setAttribute("width", Math.abs(x - start));
      }
    });
    this.root.addEventListener("mouseup", function (e) {
      var x = self.svgX(e);
      if (start !== null && Math.abs(x - start) > 4) self.zoom(self.t(start), self.t(x));
      start = null;
      self.band.setAttribute("width", 0);
    });
    this.root.addEventListener("dblclick", function () { self.reset(); });
  };

  function timeline(data) {
    var series = [], labels = [];
    data.runs.forEach(function (r, i) {
      if (r.points.length) series.push({ name: r.name, points: r.points, color: COLORS[i % COLORS.length] });
      r.labels.forEach(function (l) { labels.push(l); });
    });
    if (!series.length) return null;
    var box = section("Memory timeline", "gmt-timeline");
    return new Chart(box, series, labels);
  }

  /* ---- per-line table --------------------------------------------------------------- */
  var LINE_COLUMNS = [
    ["file", "file", "text"], ["line", "line", "num"], ["function", "function", "text"], ["code", "code", "text"],
    ["hits", "hits", "num"], ["memory", "memory after", "bytes"], ["increment", "increment", "bytes"],
    ["peak", "peak", "bytes"], ["seconds", "seconds", "num"]
  ];
  function LineTable(box, runs) {
    this.runs = runs; this.run = 0; this.key = "increment"; this.descending = true; this.file = "";
    var controls = box.appendChild(el("div", { "class": "controls" }));
    var self = this;
    if (runs.length > 1) {
      var pick = controls.appendChild(el("select", { id: "gmt-run-pick" }));
      runs.forEach(function (r, i) { pick.appendChild(el("option", { value: i }, r.name)); });
      pick.addEventListener("change", function () { self.run = +pick.value; self.fillFiles(); self.draw(); });
    }
    controls.appendChild(el("label", { "for": "gmt-file" }, "file "));
    this.files = controls.appendChild(el("select", { id: "gmt-file" }));
    this.files.addEventListener("change", function () { self.file = self.files.value; self.draw(); });
    this.table = box.appendChild(el("div", { "class": "lines-box" })).appendChild(el("table", { "class": "lines", id: "gmt-lines" }));
    var head = this.table.appendChild(el("thead")).appendChild(el("tr"));
    LINE_COLUMNS.forEach(function (c) {
      var th = head.appendChild(el("th", { "data-key": c[0], "class": c[2] === "text" ? "" : "num" }, c[1]));
      th.addEventListener("click", function () { self.sortBy(c[0]); });
    });
    this.body = this.table.appendChild(el("tbody"));
    this.fillFiles();
    this.draw();
  }
  LineTable.prototype.fillFiles = function () {
    var files = {}, select = this.files;
    this.runs[this.run].lines.forEach(function (r) { files[r.file] = true; });
    while (select.firstChild) select.removeChild(select.firstChild);
    select.appendChild(el("option", { value: "" }, "all files"));
    Object.keys(files).sort().forEach(function (f) { select.appendChild(el("option", { value: f }, f)); });
    this.file = "";
  };
  LineTable.prototype.sortBy = function (key) {
    this.descending = this.key === key ? !this.descending : key !== "file" && key !== "function" && key !== "code";
    this.key = key;
    this.draw();
  };
  LineTable.prototype.rows = function () {
    var key = this.key, sign = this.descending ? -1 : 1, file = this.file;
    var rows = this.runs[this.run].lines.filter(function (r) { return !file || r.file === file; });
    return rows.sort(function (a, b) {
      var x = a[key], y = b[key];
      if (x === y) return a.file < b.file ? -1 : a.file > b.file ? 1 : a.line - b.line;
      return (x < y ? -1 : 1) * sign;
    });
  };
  LineTable.prototype.draw = function () {
    var self = this, body = this.body;
    while (body.firstChild) body.removeChild(body.firstChild);
    this.rows().forEach(function (r) {
      var tr = body.appendChild(el("tr"));
      LINE_COLUMNS.forEach(function (c) {
        var v = r[c[0]], text = v;
        if (c[2] === "bytes") text = (c[0] === "peak" && !r.peak_exact ? ">=" : "") + bytes(v, c[0] === "increment");
        if (c[0] === "file") text = v.split("/").pop();
        if (c[0] === "seconds") text = v === null ? "-" : v.toFixed(4);
        var td = tr.appendChild(el("td", { "class": c[2] === "text" ? c[0] : "num", title: c[0] === "file" ? v : "" }, text));
        td.setAttribute("data-value", v);
      });
    });
    Array.prototype.forEach.call(this.table.querySelectorAll("th"), function (th) {
      var on = th.getAttribute("data-key") === self.key;
      th.setAttribute("aria-sort", on ? (self.descending ? "descending" : "ascending") : "none");
    });
  };
  LineTable.prototype.column = function (key) {
    var index = LINE_COLUMNS.map(function (c) { return c[0]; }).indexOf(key);
    return Array.prototype.map.call(this.body.rows, function (tr) { return tr.cells[index].getAttribute("data-value"); });
  };

  function lineTable(data) {
    var runs = data.runs.filter(function (r) { return r.lines.length; });
    if (!runs.length) return null;
    return new LineTable(section("Lines", "gmt-line-section"), runs);
  }

  /* ---- censuses, ranks, comparison -------------------------------------------------- */
  function censuses(data) {
    var any = data.runs.some(function (r) { return r.censuses.length; });
    if (!any) return;
    var box = section("Censuses (tensor groups created or freed)", "gmt-censuses");
    data.runs.forEach(function (r) {
      r.censuses.forEach(function (c) {
        var details = box.appendChild(el("details", { "class": "census" }));
        var title = (data.runs.length > 1 ? r.name + ": " : "") + c.where + (c.label ? " [" + c.label + "]" : "") +
          " at " + c.elapsed.toFixed(3) + " s, tensors " + bytes(c.tensors) + " (" + c.origin + ")";
        details.appendChild(el("summary", {}, title));
        var rows = c.changes.map(function (g) {
          return [bytes(g.bytes_delta, true), (g.count_delta > 0 ? "+" : "") + g.count_delta, g.kind, g.shape, g.dtype, g.names.join(", ")];
        });
        if (c.more_changes) rows.push(["... " + c.more_changes + " more", "", "", "", "", ""]);
        details.appendChild(plainTable(["bytes", "count", "kind", "shape", "dtype", "names"], rows));
      });
    });
  }
  function ranks(data) {
    var rows = [];
    data.runs.forEach(function (r) {
      r.ranks.forEach(function (k) { rows.push([r.name, "rank " + k.rank, k.device || "?", bytes(k.peak), String(k.points.length)]); });
    });
    if (!rows.length) return;
    var box = section("Ranks", "gmt-ranks");
    box.appendChild(plainTable(["run", "rank", "device", "peak", "points"], rows));
    data.runs.forEach(function (r) {
      if (r.ranks.length < 1) return;
      var series = r.ranks.map(function (k, i) {
        return { name: r.name + " rank " + k.rank, color: COLORS[i % COLORS.length],
                 points: k.points.map(function (p) { return [p[0], p[1], "rank " + k.rank]; }) };
      }).filter(function (s) { return s.points.length; });
      if (series.length) new Chart(box, series, []);
    });
  }
  function comparison(data) {
    var c = data.comparison;
    if (!c) return;
    var box = section("Comparison: B (" + c.b + ") minus A (" + c.a + "), by " + c.by, "gmt-comparison");
    box.appendChild(el("p", {}, "peak A " + bytes(c.peak_a) + ", peak B " + bytes(c.peak_b) +
      ", B-A " + (c.peak_a === null || c.peak_b === null ? "n/a" : bytes(c.peak_b - c.peak_a, true))));
    var rows = c.rows.slice(0, 200).map(function (r) {
      return [r.key, bytes(r.a), bytes(r.b), bytes(r.difference, true), bytes(r.peak_difference, true)];
    });
    var value = c.by === "label" ? "memory" : "increment";
    box.appendChild(plainTable(["key", "A " + value, "B " + value, "B-A", "peak B-A"], rows));
  }

  /* ---- self test (#selftest) -------------------------------------------------------- */
  function sorted(values, descending) {
    for (var i = 1; i < values.length; i++) {
      var a = +values[i - 1], b = +values[i];
      if (descending ? a < b : a > b) return false;
    }
    return true;
  }
  function selftest(chart, table) {
    var results = [];
    if (table) {
      var th = table.table.querySelector("th[data-key='peak']");
      th.dispatchEvent(new MouseEvent("click", { bubbles: true }));
      var first = table.column("peak");
      th.dispatchEvent(new MouseEvent("click", { bubbles: true }));
      var second = table.column("peak");
      results.push("sort-desc:" + (sorted(first, true) ? "ok" : "bad"));
      results.push("sort-asc:" + (sorted(second, false) ? "ok" : "bad"));
      document.body.setAttribute("data-sorted-peaks", second.join(","));
    }
    if (chart) {
      var before = +chart.root.getAttribute("data-points");
      chart.zoom(chart.full[0], (chart.full[0] + chart.full[1]) / 2);
      var after = +chart.root.getAttribute("data-points");
      chart.reset();
      results.push("zoom:" + (after <= before && +chart.root.getAttribute("data-points") === before ? "ok" : "bad"));
      chart.hover(chart.x(chart.full[1]));
      results.push("hover:" + (chart.tip.textContent.indexOf(" | ") > 0 ? "ok" : "bad"));
    }
    document.body.setAttribute("data-selftest", results.join(" "));
  }

  function main() {
    var data = JSON.parse(document.getElementById("gmt-data").textContent);
    document.getElementById("gmt-title").textContent = "gpu_mem_track: " + data.title;
    summary(data);
    var chart = timeline(data);
    var table = lineTable(data);
    comparison(data);
    ranks(data);
    censuses(data);
    if (window.location.hash === "#selftest") selftest(chart, table);
    document.body.setAttribute("data-status", "ready");
  }
  try { main(); } catch (e) { fail(e && e.stack ? e.stack : e); }
})();
