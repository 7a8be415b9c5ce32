// Charts: draw each panel's figure (json_script) with Plotly; the range picker fetches the
// chart endpoint's JSON for that range and redraws; export links follow the range. When a live
// delta names a node this page watches, every chart refetches its range (at most every 5 s).
(function () {
  "use strict";
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const watched = new Set(page.watch_nodes || []);
  const panels = [...document.querySelectorAll(".chart-panel")];
  const CONFIG = { responsive: true, displaylogo: false };
  const REFRESH_MS = 5000;
  let lastRefresh = 0, refreshTimer = null;

  function chartDiv(panel) { return panel.querySelector(".chart"); }

  function setRange(panel, range) {
    panel.dataset.range = range;
    panel.querySelectorAll(".range-picker button").forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.range === range)));
    panel.querySelectorAll("a.export").forEach((a) => { a.href = `${panel.dataset.url}.${a.dataset.format}?range=${range}`; });
  }

  async function load(panel) {
    const range = panel.dataset.range;
    panel.dataset.loading = "true";
    try {
      const response = await fetch(`${panel.dataset.url}.json?range=${encodeURIComponent(range)}`, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const body = await response.json();
      if (panel.dataset.range !== range) return;  // picked another range meanwhile
      await Plotly.react(chartDiv(panel), body.figure.data, body.figure.layout, CONFIG);
      panel.dataset.error = "";
    } catch (error) {
      panel.dataset.error = String(error);
      console.warn(`chart ${panel.dataset.chart}: ${error}`);
    } finally {
      panel.dataset.loading = "false";
    }
  }

  function refreshAll() {
    refreshTimer = null; lastRefresh = Date.now();
    panels.forEach(load);
  }

  function scheduleRefresh() {
    if (refreshTimer !== null) return;
    refreshTimer = setTimeout(refreshAll, Math.max(0, lastRefresh + REFRESH_MS - Date.now()));
  }

  panels.forEach((panel) => {
    const figure = JSON.parse(document.getElementById(panel.dataset.figure).textContent);
    Plotly.newPlot(chartDiv(panel), figure.data, figure.layout, CONFIG);
    panel.querySelectorAll(".range-picker button").forEach((button) => {
      button.addEventListener("click", () => { setRange(panel, button.dataset.range); load(panel); });
    });
  });
  document.addEventListener("opsboard:delta", (event) => {
    if (event.detail.nodes.some((node) => watched.has(node.node))) scheduleRefresh();
  });
  window.opsboardCharts = { refreshAll };
})();
