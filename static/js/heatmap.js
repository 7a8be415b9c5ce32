// The run page's heat-map: a click on a rank's row opens that rank's page. The figure's
// meta.ranks names the rank of each row (its labels carry node and GPU too). Past 1,024
// ranks the rows are groups of nodes (meta.groups: each row's first and last node, null on
// a rank's own row): a click on a group's row draws that group's ranks instead, and a
// button goes back to the whole run. The page fetches the figure after load (charts.js),
// so the click is watched once it is drawn.
(function () {
  "use strict";
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const chart = document.getElementById("chart-step_time");
  if (!chart || !page.rank_url) return;
  const panel = chart.closest(".chart-panel");

  function rowOf(point) {
    return Array.isArray(point.pointIndex) ? point.pointIndex[0] : -1;
  }

  function rankOf(point) {
    const ranks = (point.data.meta && point.data.meta.ranks) || [];
    const rank = ranks[rowOf(point)];
    return Number.isInteger(rank) ? rank : null;
  }

  function groupOf(point) {
    const groups = (point.data.meta && point.data.meta.groups) || [];
    const group = groups[rowOf(point)];
    return Array.isArray(group) ? group : null;
  }

  function backButton() {
    let button = panel.querySelector(".heatmap-back");
    if (!button) {
      button = document.createElement("button");
      button.type = "button"; button.className = "heatmap-back";
      button.textContent = "← all ranks";
      button.addEventListener("click", () => drill(null));
      chart.before(button);
    }
    return button;
  }

  // null: the whole run again; [first, last]: that group's ranks
  function drill(group) {
    if (group) {
      const query = new URLSearchParams({ node_from: group[0], node_to: group[1] });
      panel.dataset.query = query.toString();
    } else {
      delete panel.dataset.query;
    }
    backButton().hidden = !group;
    panel.dispatchEvent(new CustomEvent("opsboard:reload"));
  }

  function watchClicks() {
    chart.on("plotly_click", (event) => {
      if (!event.points || !event.points.length) return;
      const point = event.points[0], rank = rankOf(point), group = groupOf(point);
      if (rank !== null) window.location.assign(`${page.rank_url}${rank}/`);
      else if (group !== null) drill(group);
    });
  }

  // charts.js fetches the heat-map after load: Plotly's events exist once it is drawn
  if (typeof chart.on === "function") watchClicks();
  else chart.addEventListener("opsboard:drawn", watchClicks, { once: true });
})();
