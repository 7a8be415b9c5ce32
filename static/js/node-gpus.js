// The node page's GPU highlight: one GPU (?gpu=N, the picker, or a click on its legend entry)
// keeps its colour in every chart and the others turn grey. Traces name their GPU in
// trace.meta ({gpu, color}, apps/dashboard/charts/node.py); a chart redrawn by charts.js
// (a new range, a live refresh) is highlighted again after it is drawn.
(function () {
  "use strict";
  const GREY = "#c9ccd1";
  const picker = document.getElementById("gpu-picker");
  const divs = [...document.querySelectorAll(".chart-panel .chart")];
  const fromUrl = new URLSearchParams(location.search).get("gpu");
  let selected = fromUrl !== null && /^\d+$/.test(fromUrl) ? Number(fromUrl) : null;

  function wanted(meta) {
    if (selected === null) return { color: meta.color, width: 1.5, opacity: 1 };
    if (meta.gpu === selected) return { color: meta.color, width: 3, opacity: 1 };
    return { color: GREY, width: 1, opacity: 0.6 };
  }

  function highlight(div) {
    if (!div.data) return;
    const indexes = [], colors = [], widths = [], opacities = [];
    div.data.forEach((trace, i) => {
      const meta = trace.meta;
      if (!meta || typeof meta.gpu !== "number") return;
      const want = wanted(meta);
      const line = trace.line || {};
      if (line.color === want.color && line.width === want.width && trace.opacity === want.opacity) return;
      indexes.push(i); colors.push(want.color); widths.push(want.width); opacities.push(want.opacity);
    });
    if (!indexes.length) return;  // already as wanted: no restyle, so no redraw loop
    Plotly.restyle(div, { "line.color": colors, "marker.color": colors, "line.width": widths, opacity: opacities }, indexes);
  }

  function select(gpu) {
    selected = gpu;
    const url = new URL(location.href);
    if (gpu === null) url.searchParams.delete("gpu"); else url.searchParams.set("gpu", String(gpu));
    history.replaceState(history.state, "", url);
    if (picker) {
      picker.querySelectorAll("button").forEach((b) => {
        b.setAttribute("aria-pressed", String(b.dataset.gpu === (gpu === null ? "" : String(gpu))));
      });
    }
    divs.forEach(highlight);
  }

  function attach(div, tries) {
    if (typeof div.on !== "function") {
      if (tries > 0) setTimeout(() => attach(div, tries - 1), 200);
      return;
    }
    div.on("plotly_afterplot", () => highlight(div));
    div.on("plotly_legendclick", (event) => {
      const meta = event.data[event.curveNumber].meta;
      if (!meta || typeof meta.gpu !== "number") return true;  // not a GPU: Plotly's own toggle
      select(selected === meta.gpu ? null : meta.gpu);
      return false;
    });
    highlight(div);
  }

  if (picker) {
    picker.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-gpu]");
      if (button) select(button.dataset.gpu === "" ? null : Number(button.dataset.gpu));
    });
  }
  divs.forEach((div) => attach(div, 50));
  window.opsboardGpuHighlight = { select, selected: () => selected };
})();
