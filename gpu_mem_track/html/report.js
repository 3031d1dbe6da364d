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
  var NUMBER = /^(>=)?[-+]?[\d.,]+( (B|KiB|MiB|GiB|TiB|s))?$|^n\/a$|^-$/;  // right-aligned cells

  function bytes(n, signed) {
    if (n === null || n === undefined) return "n/a";
    var sign = n < 0 ? "-" : (signed ? "+" : ""), m = Math.abs(n), p = 0;
    if (m < 1024) return sign + m + " B";
    while (m >= 1024 && p < UNITS.length - 1) { m /= 1024; p++; }
    return sign + m.toFixed(2) + " " + UNITS[p];
  }
  function seconds(v) { return v === null || v === undefined ? "-" : v.toFixed(4); }
  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVGNS, tag);
    for (var k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function section(title, id) {
    var box = el("section", { id: id });
    box.appendChild(el("h2", {}, title));
    document.getElementById("gmt-main").appendChild(box);
    return box;
  }
  function swatch(name, color) { return { text: "\u25A0 " + name, color: color }; }

  /* Every run, and every rank of a launch, gets its own colour, the same in every table,
     the timeline and its key. */
  function paint(data) {
    var next = 0;
    data.runs.forEach(function (r) {
      if (r.kind !== "launch") r.color = COLORS[next++ % COLORS.length];
      r.ranks.forEach(function (k) { k.color = COLORS[next++ % COLORS.length]; });
      if (r.kind === "launch") r.color = "#495057";
    });
  }

  /* ---- summary ---------------------------------------------------------------------- */
  function summary(data) {
    var box = section("Runs", "gmt-runs");
    var rows = data.runs.map(function (r) {
      var launch = r.kind === "launch";
      var kind = launch ? "launch of " + r.ranks.length + " ranks" : r.kind;
      var peak = bytes(r.peak) + (launch && r.peak_rank !== null && r.peak_rank !== undefined ? " (rank " + r.peak_rank + ")" : "");
      var lines = launch ? "-" : String(r.lines.length);
      return [swatch(r.name, r.color), kind, r.device || "?", r.memory_source || "?", peak, r.status || "-",
        String(r.events), lines, r.path];
    });
    box.appendChild(plainTable(["run", "kind", "device", "memory", "peak", "status", "events", "lines", "path"], rows));
    if (data.runs.some(function (r) { return r.kind === "launch"; }))
      box.appendChild(el("p", { "class": "note" }, "A launch's peak is its highest rank's; every rank's is in the Ranks table."));
    data.notes.forEach(function (n) { box.appendChild(el("p", { "class": "note" }, n)); });
  }
  function plainTable(headers, rows, id) {
    var table = el("table", { "class": "plain" }), head = el("tr");
    if (id) table.id = id;
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

  /* ---- ranks and snapshots: above the timeline --------------------------------------- */
  function ranks(data) {
    var runs = data.runs.filter(function (r) { return r.ranks.length; });
    if (!runs.length) return;
    var box = section("Ranks", "gmt-ranks");
    runs.forEach(function (r) {
      if (runs.length > 1) box.appendChild(el("h3", {}, r.name));
      var rows = r.ranks.map(function (k) {
        var phase = k.peak_phase ? " (" + k.peak_phase + ")" : "";
        return [swatch("rank " + k.rank, k.color), k.status, k.device || "?", bytes(k.peak),
          k.difference === null ? "-" : bytes(k.difference, true), bytes(k.end_memory),
          (k.peak_at ? k.peak_at.split("/").pop() : "-") + phase];
      });
      box.appendChild(plainTable(["rank", "status", "device", "peak", "vs rank 0", "at end", "peak at (phase)"], rows, "gmt-rank-table"));
      var launch = r.launch || {};
      var text = launch.spread_text ? "Spread: largest peak / smallest = " + launch.spread_text : "";
      if (launch.script) text += (text ? "; " : "") + "script " + launch.script + ", world size " + launch.world_size;
      if (text) box.appendChild(el("p", { "class": "note" }, text));
    });
  }
  function snapshots(data) {
    data.runs.forEach(function (r, i) {
      if (!r.snapshot) return;
      var box = section("Snapshot: " + r.name, "gmt-snapshot" + (i ? "-" + i : ""));
      var wrap = box.appendChild(el("div", { "class": "side" }));
      var rows = r.snapshot.rows.map(function (row) { return [row[0], { text: row[1] }]; });  // text, left-aligned
      wrap.appendChild(plainTable(["", "the caching allocator"], rows));
      wrap.appendChild(plainTable(["phase", "live at peak", "allocated", "allocations"], r.snapshot.phases));
    });
  }

  /* ---- timeline --------------------------------------------------------------------- */
  var H = 340;
  var KIB = 1024, MIB = KIB * 1024, GIB = MIB * 1024;

  /* A round step near span / count: 1, 2, 2.5 or 5 times a power of ten. */
  function niceStep(span, count) {
    var raw = span / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * power >= raw) return steps[i] * power;
    return 10 * power;
  }
  function decimals(step) { return Math.max(0, -Math.floor(Math.log10(step) + 1e-9)) + (step / Math.pow(10, Math.floor(Math.log10(step) + 1e-9)) === 2.5 ? 1 : 0); }
  /* Round byte ticks: a unit the top reaches (B, KiB, MiB, GiB) and a round step in it. */
  function byteTicks(top) {
    var unit = top >= GIB ? GIB : top >= MIB ? MIB : top >= KIB ? KIB : 1;
    var name = { 1: "B", 1024: "KiB" }[unit] || (unit === MIB ? "MiB" : "GiB");
    var step = niceStep(Math.max(top / unit, 1e-9), 5);
    if (unit === 1) step = Math.max(1, Math.round(step));
    var n = Math.ceil(top / unit / step - 1e-9), ticks = [], places = decimals(step);
    for (var i = 0; i <= n; i++) ticks.push({ value: i * step * unit, text: (i * step).toFixed(places) + " " + name });
    return ticks;
  }
  function timeTicks(d0, d1, width) {
    var step = niceStep(d1 - d0, Math.max(2, Math.floor(width / 110))), places = decimals(step), ticks = [];
    for (var t = Math.ceil(d0 / step - 1e-9) * step; t <= d1 + step * 1e-6; t += step) ticks.push({ value: t, text: t.toFixed(places) + " s" });
    return ticks;
  }

  function Chart(box, series, labels, id) {
    this.series = series; this.labels = labels; this.box = box;
    // the margins: room along the top for the stamps' labels when there are any
    this.m = { left: 78, right: 16, top: labels.length ? 40 : 16, bottom: 30 };
    var all = [0];  // the axis starts at the run's start
    series.forEach(function (s) { s.points.forEach(function (p) { all.push(p[0]); }); });
    this.full = [Math.min.apply(null, all), Math.max.apply(null, all)];
    if (this.full[0] === this.full[1]) this.full[1] = this.full[0] + 1;
    this.domain = this.full.slice();
    series.forEach(function (s) {
      s.peak = s.points.reduce(function (best, p) { return !best || p[1] > best[1] ? p : best; }, null);
    });
    this.root = svg("svg", { "class": "chart", id: id || "gmt-chart", role: "img" });
    box.appendChild(this.root);
    this.key(box);
    this.tip = box.appendChild(el("div", { "class": "tip", id: (id || "gmt-chart") + "-tip" }));
    box.appendChild(el("p", { "class": "hint" },
      "Drag across the chart to zoom into a time range; double-click to see the whole run. " +
      "Hover for the line and the memory after it. Solid: memory; dashed: the allocator's reserved bytes; " +
      "dashed verticals: track() stamps in their run's colour, labelled along the top; \u25BC each curve's peak."));
    this.bind();
    this.resize();
    var self = this;
    window.addEventListener("resize", function () { self.resize(); });
  }
  Chart.prototype.key = function (box) {
    var key = box.appendChild(el("div", { "class": "key" }));
    this.series.forEach(function (s) {
      var item = key.appendChild(el("span", { "class": "key-item" }));
      item.appendChild(el("span", { "class": "key-line", style: "border-color:" + s.color }));
      item.appendChild(document.createTextNode(s.name + (s.reserved && s.reserved.length ? " (dashed: reserved)" : "")));
    });
  };
  Chart.prototype.resize = function () {
    this.W = Math.max(480, Math.floor(this.box.getBoundingClientRect().width) - 34);
    this.root.setAttribute("viewBox", "0 0 " + this.W + " " + H);
    this.root.setAttribute("width", this.W);
    this.root.setAttribute("height", H);
    this.draw();
  };
  Chart.prototype.x = function (t) {
    var M = this.m;
    return M.left + (t - this.domain[0]) / (this.domain[1] - this.domain[0]) * (this.W - M.left - M.right);
  };
  Chart.prototype.t = function (x) {
    var M = this.m;
    return this.domain[0] + (x - M.left) / (this.W - M.left - M.right) * (this.domain[1] - this.domain[0]);
  };
  /* The points inside the window, with the one before it and the one after it: a step
     holds until the next reading, so the curve crosses the whole window. */
  Chart.prototype.visible = function (points) {
    var d = this.domain, first = -1, last = -1;
    for (var i = 0; i < points.length; i++) {
      if (points[i][0] < d[0]) first = i;
      else if (points[i][0] <= d[1]) last = i;
      else { last = i; break; }
    }
    if (last < 0) last = first;  // the run ended before the window: only its last value
    return points.slice(Math.max(0, first), last + 1);
  };
  Chart.prototype.inside = function (points) {
    var d = this.domain;
    return points.filter(function (p) { return p[0] >= d[0] && p[0] <= d[1]; }).length;
  };
  Chart.prototype.stepPath = function (points) {
    var self = this;
    return points.map(function (p, k) {
      var x = self.x(p[0]).toFixed(1), yy = self.y(p[1]).toFixed(1);
      return k ? "H" + x + "V" + yy : "M" + x + "," + yy;
    }).join("");
  };
  Chart.prototype.draw = function () {
    var M = this.m;
    var self = this, root = this.root, W = this.W;
    while (root.firstChild) root.removeChild(root.firstChild);
    var top = 1;
    this.series.forEach(function (s) {
      self.visible(s.points).forEach(function (p) { top = Math.max(top, p[1]); });
      self.visible(s.reserved || []).forEach(function (p) { top = Math.max(top, p[1]); });
    });
    var yTicks = byteTicks(top * 1.04);
    this.top = yTicks[yTicks.length - 1].value;
    this.y = function (v) { return H - M.bottom - v / self.top * (H - M.top - M.bottom); };
    var clip = root.appendChild(svg("clipPath", { id: root.id + "-clip" }));
    clip.appendChild(svg("rect", { x: M.left, y: M.top - 8, width: W - M.left - M.right, height: H - M.top - M.bottom + 8 }));
    yTicks.forEach(function (tick) {
      var yy = self.y(tick.value);
      root.appendChild(svg("line", { x1: M.left, x2: W - M.right, y1: yy, y2: yy, "class": "grid" }));
      root.appendChild(svg("text", { x: M.left - 6, y: yy + 4, "text-anchor": "end", "class": "axis" }, tick.text));
    });
    timeTicks(this.domain[0], this.domain[1], W - M.left - M.right).forEach(function (tick) {
      var xx = self.x(tick.value);
      root.appendChild(svg("line", { x1: xx, x2: xx, y1: H - M.bottom, y2: H - M.bottom + 4, "class": "tick" }));
      root.appendChild(svg("text", { x: xx, y: H - 10, "text-anchor": "middle", "class": "axis" }, tick.text));
    });
    root.appendChild(svg("line", { x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom, "class": "baseline" }));
    this.stamps();
    var drawn = root.appendChild(svg("g", { "clip-path": "url(#" + root.id + "-clip)" }));
    this.series.forEach(function (s) {
      var reserved = self.visible(s.reserved || []);
      if (reserved.length) drawn.appendChild(svg("path", { d: self.stepPath(reserved), stroke: s.color, "class": "series reserved" }));
      var pts = self.visible(s.points);
      if (pts.length) drawn.appendChild(svg("path", { d: self.stepPath(pts), stroke: s.color, "class": "series", "data-name": s.name }));
    });
    this.peaks();
    this.band = root.appendChild(svg("rect", { y: M.top, height: H - M.top - M.bottom, width: 0, "class": "band" }));
    this.cursor = root.appendChild(svg("line", { x1: -10, x2: -10, y1: M.top, y2: H - M.bottom, "class": "cursor" }));
    root.setAttribute("data-points", String(this.series.reduce(function (n, s) { return n + self.inside(s.points); }, 0)));
  };
  /* Each series' peak: a triangle and its value, moved down where two labels would meet. */
  Chart.prototype.peaks = function () {
    var M = this.m;
    var self = this, placed = [], shown = this.series.filter(function (s) {
      return s.peak && s.peak[0] >= self.domain[0] && s.peak[0] <= self.domain[1];
    });
    shown.forEach(function (s) {  // the markers first: no label may cover one
      var x = self.x(s.peak[0]), y = self.y(s.peak[1]);
      placed.push([x - 6, y - 11, x + 6, y]);
    });
    shown.forEach(function (s) {
      var p = s.peak, x = self.x(p[0]), y = self.y(p[1]);
      self.root.appendChild(svg("path", { d: "M" + x + "," + (y - 1) + "l-5,-9h10z", fill: s.color, "class": "peak-mark" }));
      var text = "peak " + bytes(p[1]), width = text.length * 6.6 + 4;
      var right = x + 8 + width < self.W - M.right, lx = right ? x + 8 : x - 8 - width, ly = Math.max(M.top + 2, y - 6);
      while (placed.some(function (b) { return lx < b[2] && lx + width > b[0] && ly - 11 < b[3] && ly + 2 > b[1]; })) ly += 14;
      placed.push([lx, ly - 11, lx + width, ly + 2]);
      var label = svg("text", { x: right ? lx : lx + width, y: ly, "text-anchor": right ? "start" : "end", fill: s.color, "class": "peak-label" }, text);
      label.appendChild(svg("title", {}, s.name + ": peak " + bytes(p[1]) + " at " + p[0].toFixed(4) + " s, " + (p[2] || "")));
      self.root.appendChild(label);
    });
  };
  /* track() stamps: a dashed vertical each, their labels along the top in two rows;
     a label that fits in neither row is left to the vertical's tooltip. */
  Chart.prototype.stamps = function () {
    var M = this.m;
    var self = this, ends = [-Infinity, -Infinity], shown = 0;
    this.labels.forEach(function (l) {
      if (l[0] < self.domain[0] || l[0] > self.domain[1]) return;
      var x = self.x(l[0]);
      var mark = self.root.appendChild(svg("line", { x1: x, x2: x, y1: M.top - 4, y2: H - M.bottom, "class": "mark", stroke: l[4] || "#adb5bd" }));
      var name = l[2] || "track()";
      mark.appendChild(svg("title", {}, name + " at " + l[3] + ", " + l[0].toFixed(4) + " s, " + bytes(l[1])));
      var text = name.length > 22 ? name.slice(0, 21) + "\u2026" : name, width = text.length * 6 + 6;
      var left = Math.min(Math.max(x - width / 2, 0), self.W - width);  // kept inside the chart
      for (var row = 0; row < 2; row++) {
        if (left > ends[row]) {
          ends[row] = left + width;
          self.root.appendChild(svg("text", { x: left + width / 2, y: 13 + row * 13, "text-anchor": "middle", "class": "stamp", fill: l[4] || "#6c757d" }, text));
          shown++;
          break;
        }
      }
    });
    this.root.setAttribute("data-stamp-labels", String(shown));
  };
  Chart.prototype.svgX = function (event) {
    var box = this.root.getBoundingClientRect();
    return (event.clientX - box.left) / box.width * this.W;
  };
  Chart.prototype.nearest = function (t) {
    var best = null, d0 = this.domain[0], d1 = this.domain[1];
    this.series.forEach(function (s) {
      s.points.forEach(function (p) {
        if (p[0] < d0 || p[0] > d1) return;
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
    data.runs.forEach(function (r) {
      if (r.points.length) series.push({ name: r.name, points: r.points, reserved: r.reserved, color: r.color });
      r.ranks.forEach(function (k) {
        var name = (data.runs.length > 1 || r.kind !== "launch" ? r.name + " " : "") + "rank " + k.rank;
        if (k.points.length) series.push({ name: name, points: k.points, reserved: k.reserved, color: k.color });
        k.labels.forEach(function (l) { labels.push(l.concat([k.color])); });
      });
      r.labels.forEach(function (l) { labels.push(l.concat([r.color])); });
    });
    var seen = {};  // one stamp per label, time and colour
    labels = labels.filter(function (l) {
      var key = l[2] + "@" + l[0].toFixed(3) + l[4];
      return seen[key] ? false : (seen[key] = true);
    });
    if (!series.length) return null;
    var box = section("Memory timeline", "gmt-timeline");
    return new Chart(box, series, labels.sort(function (a, b) { return a[0] - b[0]; }));
  }

  /* ---- per-line table --------------------------------------------------------------- */
  var LINE_COLUMNS = [
    ["file", "file", "text"], ["line", "line", "num"], ["function", "function", "text"], ["code", "code", "text"],
    ["hits", "hits", "num"], ["memory", "memory after", "bytes"], ["increment", "increment", "bytes"],
    ["peak", "peak", "bytes"], ["seconds", "seconds", "num"]
  ];
  /* A snapshot's lines: allocations instead of hits, the phase and the bytes live at the
     peak, and when the line first and last allocated or freed in the trace (its wall
     time is not recorded). */
  var SNAPSHOT_COLUMNS = [
    ["file", "file", "text"], ["line", "line", "num"], ["function", "function", "text"], ["code", "code", "text"],
    ["hits", "allocations", "num"], ["phase", "phase", "text"], ["live_at_peak", "live at peak", "bytes"],
    ["memory", "memory after", "bytes"], ["increment", "increment", "bytes"], ["peak", "peak", "bytes"],
    ["first", "first s", "num"], ["last", "last s", "num"]
  ];
  function LineTable(box, runs) {
    this.runs = runs; this.run = 0; this.key = "increment"; this.descending = true; this.file = "";
    var controls = box.appendChild(el("div", { "class": "controls" }));
    var self = this;
    if (runs.length > 1) {
      controls.appendChild(el("label", { "for": "gmt-run-pick" }, "run "));
      var pick = controls.appendChild(el("select", { id: "gmt-run-pick" }));
      runs.forEach(function (r, i) { pick.appendChild(el("option", { value: i }, r.name)); });
      pick.addEventListener("change", function () { self.run = +pick.value; self.fillFiles(); self.header(); self.draw(); });
    }
    controls.appendChild(el("label", { "for": "gmt-file" }, "file "));
    this.files = controls.appendChild(el("select", { id: "gmt-file" }));
    this.files.addEventListener("change", function () { self.file = self.files.value; self.draw(); });
    this.table = box.appendChild(el("div", { "class": "lines-box" })).appendChild(el("table", { "class": "lines", id: "gmt-lines" }));
    this.head = this.table.appendChild(el("thead")).appendChild(el("tr"));
    this.body = this.table.appendChild(el("tbody"));
    this.fillFiles();
    this.header();
    this.draw();
  }
  LineTable.prototype.columns = function () {
    return this.runs[this.run].kind === "snapshot" ? SNAPSHOT_COLUMNS : LINE_COLUMNS;
  };
  LineTable.prototype.header = function () {
    var self = this, head = this.head;
    while (head.firstChild) head.removeChild(head.firstChild);
    this.columns().forEach(function (c) {
      var th = head.appendChild(el("th", { "data-key": c[0], "class": c[2] === "text" ? "" : "num" }, c[1]));
      th.addEventListener("click", function () { self.sortBy(c[0]); });
    });
  };
  LineTable.prototype.fillFiles = function () {
    var files = {}, select = this.files;
    this.runs[this.run].lines.forEach(function (r) { files[r.file] = true; });
    while (select.firstChild) select.removeChild(select.firstChild);
    select.appendChild(el("option", { value: "" }, "all files"));
    Object.keys(files).sort().forEach(function (f) { select.appendChild(el("option", { value: f }, f)); });
    this.file = "";
  };
  LineTable.prototype.sortBy = function (key) {
    this.descending = this.key === key ? !this.descending : ["file", "function", "code", "phase"].indexOf(key) < 0;
    this.key = key;
    this.draw();
  };
  LineTable.prototype.rows = function () {
    var key = this.key, sign = this.descending ? -1 : 1, file = this.file;
    var rows = this.runs[this.run].lines.filter(function (r) { return !file || r.file === file; });
    return rows.sort(function (a, b) {
      var x = a[key], y = b[key];
      if (x === y) return a.file < b.file ? -1 : a.file > b.file ? 1 : a.line - b.line;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sign;
    });
  };
  LineTable.prototype.draw = function () {
    var self = this, body = this.body, columns = this.columns();
    while (body.firstChild) body.removeChild(body.firstChild);
    this.rows().forEach(function (r) {
      var tr = body.appendChild(el("tr"));
      columns.forEach(function (c) {
        var v = r[c[0]], text = v;
        if (c[2] === "bytes") text = (c[0] === "peak" && !r.peak_exact ? ">=" : "") + bytes(v, c[0] === "increment");
        if (c[0] === "file") text = v.split("/").pop();
        if (c[0] === "seconds" || c[0] === "first" || c[0] === "last") text = seconds(v);
        var td = tr.appendChild(el("td", { "class": c[2] === "text" ? c[0] : "num", title: c[0] === "file" ? v : "" }, text));
        td.setAttribute("data-value", v === null || v === undefined ? "" : v);
      });
    });
    Array.prototype.forEach.call(this.head.querySelectorAll("th"), function (th) {
      var on = th.getAttribute("data-key") === self.key;
      th.setAttribute("aria-sort", on ? (self.descending ? "descending" : "ascending") : "none");
    });
  };
  LineTable.prototype.column = function (key) {
    var index = this.columns().map(function (c) { return c[0]; }).indexOf(key);
    return Array.prototype.map.call(this.body.rows, function (tr) { return tr.cells[index].getAttribute("data-value"); });
  };

  function lineTable(data) {
    var runs = [];
    data.runs.forEach(function (r) {
      if (r.lines.length) runs.push(r);
      r.ranks.forEach(function (k) {
        if (k.lines.length) runs.push({ name: r.name + " rank " + k.rank, lines: k.lines, kind: "rank" });
      });
    });
    if (!runs.length) return null;
    return new LineTable(section("Lines", "gmt-line-section"), runs);
  }

  /* ---- censuses, comparison --------------------------------------------------------- */
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
    box.appendChild(el("div", { "class": "lines-box" })).appendChild(
      plainTable(["key", "A " + value, "B " + value, "B-A", "peak B-A"], rows));
  }

  /* Two snapshots compared line by line (html/snapshot.py: snapshot_comparison). */
  function snapshotComparison(data) {
    var c = data.snapshot_comparison;
    if (!c) return;
    var box = section("Snapshots compared: B (" + c.b + ") minus A (" + c.a + ")", "gmt-snapshot-comparison");
    box.appendChild(el("p", { "class": "note" }, c.matching + " " + c.matched + " of " + c.total +
      " lines in both. Sizes A/B: a request size, then how many allocations of it each made."));
    box.appendChild(plainTable(["", "A", "B", "B - A"], c.peaks));
    var heads = ["allocated A", "allocated B", "B - A", "at peak A", "at peak B", "B - A", "sizes A/B"];
    box.appendChild(plainTable(["phase"].concat(heads), c.phases, "gmt-snapshot-phases"));
    if (c.lines.length < c.total)
      box.appendChild(el("p", { "class": "note" }, "The " + c.lines.length + " lines of largest difference (of " + c.total + ")."));
    box.appendChild(el("div", { "class": "lines-box" })).appendChild(
      plainTable(["where", "phase"].concat(heads), c.lines, "gmt-snapshot-lines"));
  }

  /* ---- self test (#selftest) -------------------------------------------------------- */
  function sorted(values, descending) {
    for (var i = 1; i < values.length; i++) {
      var a = +values[i - 1], b = +values[i];
      if (descending ? a < b : a > b) return false;
    }
    return true;
  }
  /* After zooming into the middle of the run, every series that spans the window starts
     at its left edge and reaches its right edge. */
  function spansWindow(chart) {
    var ok = true, left = chart.m.left + 0.5, right = chart.W - chart.m.right - 0.5;
    chart.series.forEach(function (s) {
      var first = s.points[0][0], last = s.points[s.points.length - 1][0];
      if (first > chart.domain[0] || last < chart.domain[1]) return;
      var path = chart.root.querySelector("path.series[data-name='" + s.name.replace(/'/g, "\\'") + "']");
      var xs = path ? path.getAttribute("d").match(/[MH]-?[\d.]+/g).map(function (m) { return +m.slice(1); }) : [];
      if (!xs.length || Math.min.apply(null, xs) > left || Math.max.apply(null, xs) < right) ok = false;
    });
    return ok;
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
      var before = +chart.root.getAttribute("data-points"), span = chart.full[1] - chart.full[0];
      results.push("peak:" + (chart.root.querySelectorAll(".peak-label").length === chart.series.length ? "ok" : "bad"));
      chart.zoom(chart.full[0] + span * 0.3, chart.full[0] + span * 0.6);
      var after = +chart.root.getAttribute("data-points"), across = spansWindow(chart);
      chart.reset();
      results.push("zoom:" + (after <= before && +chart.root.getAttribute("data-points") === before ? "ok" : "bad"));
      results.push("span:" + (across ? "ok" : "bad"));
      chart.hover(chart.x(chart.full[1]));
      results.push("hover:" + (chart.tip.textContent.indexOf(" | ") > 0 ? "ok" : "bad"));
    }
    document.body.setAttribute("data-selftest", results.join(" "));
  }

  function main() {
    var data = JSON.parse(document.getElementById("gmt-data").textContent);
    document.getElementById("gmt-title").textContent = "gpu_mem_track: " + data.title;
    paint(data);
    summary(data);
    ranks(data);
    snapshots(data);
    var chart = timeline(data);
    comparison(data);
    snapshotComparison(data);
    var table = lineTable(data);
    censuses(data);
    if (window.location.hash === "#selftest") selftest(chart, table);
    document.body.setAttribute("data-status", "ready");
  }
  try { main(); } catch (e) { fail(e && e.stack ? e.stack : e); }
})();
