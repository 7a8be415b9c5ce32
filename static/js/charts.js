// Charts: one time range for the whole page. The picker (#time-range) sets a relative range
// ("1h": follows now), a brush on any time chart sets an absolute one (from/to); either goes in
// the URL (?range= or ?from=&to=, so a view can be shared and survives a reload) and every
// chart refetches its endpoint's JSON for it. Redraws use Plotly.react with layout.uirevision
// set to the range, so that a live refresh (at most every 5 s, when a live delta names a node
// this page watches) keeps what the user did to a chart. "Follow live": on, the range slides
// with now; a zoom turns it off; on again, the last relative range comes back.
// Date axes are drawn in the zone timezone.js picks (UTC or local: Unix ms shifted by its
// offset, still numbers) and say which. A panel whose figure the page does not embed is
// fetched after load.
(function () {
  "use strict";
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const zone = window.opsboardZone;
  const watched = new Set(page.watch_nodes || []);
  const panels = [...document.querySelectorAll(".chart-panel")];
  const bar = document.getElementById("time-range");
  const follow = document.getElementById("follow-live");
  const shownText = document.getElementById("range-shown");
  const CONFIG = { responsive: true, displaylogo: false };
  const REFRESH_MS = 5000;
  const MIN_SPAN_S = 10, MAX_SPAN_S = 31 * 86400;  // the server's selectors.MIN/MAX_SPAN_S
  const figures = new Map();  // panel → the last figure fetched (as the server sent it)
  let lastRefresh = 0, refreshTimer = null;

  const initial = page.range;
  // {key} follows now; {from, to} (Unix seconds) is fixed
  let range = initial.key === "custom" ? { from: initial.start, to: initial.end } : { key: initial.key };
  let lastRelative = initial.key === "custom" ? initial.default : initial.key;
  let shown = { start: initial.start, end: initial.end };  // what the last answer covered

  function chartDiv(panel) { return panel.querySelector(".chart"); }
  function query(r) { return r.key ? `range=${encodeURIComponent(r.key)}` : `from=${r.from.toFixed(3)}&to=${r.to.toFixed(3)}`; }
  function revision() { return `${query(range)}|${zone.zone}`; }

  function writeUrl() {
    const params = new URLSearchParams(location.search);
    ["range", "from", "to"].forEach((name) => params.delete(name));
    if (range.key) params.set("range", range.key);
    else {
      params.set("from", new Date(range.from * 1000).toISOString());
      params.set("to", new Date(range.to * 1000).toISOString());
    }
    history.replaceState(null, "", `${location.pathname}?${params}${location.hash}`);
  }

  function showRange() {
    if (follow) follow.setAttribute("aria-pressed", String(Boolean(range.key)));
    if (bar) bar.querySelectorAll(".range-picker button").forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.range === range.key)));
    if (shownText) {
      shownText.textContent = range.key
        ? `last ${range.key === "all" ? "all" : range.key}, following live (${zone.label()})`
        : `${zone.format(range.from * 1000).slice(0, 19)} – ${zone.format(range.to * 1000).slice(0, 19)} ${zone.label()}`;
    }
    panels.forEach((panel) => {
      panel.dataset.range = range.key || "custom";
      panel.querySelectorAll("a.export").forEach((a) => { a.href = `${panel.dataset.url}.${a.dataset.format}?${query(range)}`; });
    });
  }

  function setRange(next) {
    range = next;
    if (range.key) lastRelative = range.key;
    writeUrl(); showRange(); refreshAll();
  }

  // The figure as drawn: date axes' x values as strings of the picked zone, the axis titled
  // with it, a fixed range pinned on the axis, and the uirevision of the range.
  function zoned(figure) {
    const layout = { ...figure.layout, uirevision: revision() };
    const xaxis = layout.xaxis || {};
    if (xaxis.type !== "date") return { data: figure.data, layout };
    const title = (xaxis.title && xaxis.title.text) || "time";
    layout.xaxis = { ...xaxis, title: { ...xaxis.title, text: `${title} (${zone.label()})` } };
    if (!range.key) layout.xaxis.range = [zone.format(range.from * 1000), zone.format(range.to * 1000)];
    else if (Array.isArray(xaxis.range)) layout.xaxis.range = xaxis.range.map((x) => (typeof x === "number" ? zone.format(x) : x));
    const data = figure.data.map((trace) => (trace.x ? { ...trace, x: trace.x.map((x) => (typeof x === "number" ? zone.shift(x) : x)) } : trace));
    return { data, layout };
  }

  function draw(panel) {
    const figure = zoned(figures.get(panel));
    const div = chartDiv(panel);
    if (div.data) return Plotly.react(div, figure.data, figure.layout, CONFIG);
    return Plotly.newPlot(div, figure.data, figure.layout, CONFIG).then(() => {
      watchZoom(panel);
      div.dispatchEvent(new CustomEvent("opsboard:drawn"));  // heatmap.js waits for it
    });
  }

  function showGoodput(panel) {
    const meta = figures.get(panel).layout.meta;
    const tile = document.getElementById("goodput");
    if (panel.dataset.chart === "goodput" && tile && meta && meta.text) tile.textContent = meta.text;
  }

  async function load(panel) {
    const asked = query(range);
    panel.dataset.loading = "true";
    try {
      // a panel's own query (the heat-map's drill-down into a group, heatmap.js) goes along
      const own = panel.dataset.query ? `&${panel.dataset.query}` : "";
      const response = await fetch(`${panel.dataset.url}.json?${asked}${own}`, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const body = await response.json();
      if (query(range) !== asked) return;  // the range changed meanwhile
      shown = { start: body.start, end: body.end };
      figures.set(panel, body.figure);
      await draw(panel);
      showGoodput(panel);
      panel.dataset.error = "";
    } catch (error) {
      panel.dataset.error = String(error);
      console.warn(`chart ${panel.dataset.chart}: ${error}`);
    } finally {
      panel.dataset.loading = "false";
    }
  }

  // A brush (or the zoom buttons) on a date axis sets the page's range; "autoscale" goes back
  // to the last relative range, following live.
  function watchZoom(panel) {
    const div = chartDiv(panel);
    div.on("plotly_relayout", (event) => {
      if ((div.layout.xaxis || {}).type !== "date") return;
      const both = event["xaxis.range"] || [event["xaxis.range[0]"], event["xaxis.range[1]"]];
      if (both[0] !== undefined && both[1] !== undefined) {
        let [from, to] = both.map((v) => zone.parse(v) / 1000);
        if (!(to > from)) return;
        if (to - from < MIN_SPAN_S) { const mid = (from + to) / 2; from = mid - MIN_SPAN_S / 2; to = mid + MIN_SPAN_S / 2; }
        const same = !range.key && Math.abs(from - range.from) < 0.01 && Math.abs(to - range.to) < 0.01;
        if (!same) setRange({ from, to });  // (a redraw of the range itself is no new zoom)
      } else if (event["xaxis.autorange"]) {
        setRange({ key: lastRelative });
      }
    });
  }

  function refreshAll() {
    if (refreshTimer !== null) clearTimeout(refreshTimer);
    refreshTimer = null; lastRefresh = Date.now();
    return Promise.all(panels.map(load));
  }

  function scheduleRefresh() {
    if (refreshTimer !== null) return;
    refreshTimer = setTimeout(refreshAll, Math.max(0, lastRefresh + REFRESH_MS - Date.now()));
  }

  // A panel without an embedded figure (the heat-map: ~1 MB at 1,024 ranks) is fetched from
  // its endpoint now, as a range change would, showing its loading state until drawn.
  panels.forEach((panel) => {
    panel.addEventListener("opsboard:reload", () => load(panel));  // its own query changed
    const embedded = panel.dataset.figure && document.getElementById(panel.dataset.figure);
    if (!embedded) { load(panel); return; }
    figures.set(panel, JSON.parse(embedded.textContent));
    draw(panel);
  });
  if (bar) {
    bar.querySelectorAll(".range-picker button").forEach((button) => {
      button.addEventListener("click", () => setRange({ key: button.dataset.range }));
    });
  }
  if (follow) {
    follow.addEventListener("click", () => {
      const to = Math.min(shown.end, Date.now() / 1000);
      if (range.key) setRange({ from: Math.max(shown.start, to - MAX_SPAN_S), to });
      else setRange({ key: lastRelative });
    });
  }
  showRange();
  document.addEventListener("opsboard:delta", (event) => {
    if (event.detail.nodes.some((node) => watched.has(node.node))) scheduleRefresh();
  });
  document.addEventListener("opsboard:zone", () => { showRange(); panels.filter((p) => figures.has(p)).forEach(draw); });
  window.opsboardCharts = { refreshAll, range: () => ({ ...range }) };
})();
