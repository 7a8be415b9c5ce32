// The run page's heat-map: a click on a rank's row opens that rank's page. The figure's
// meta.ranks names the rank of each row (its labels carry node and GPU too).
(function () {
  "use strict";
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const chart = document.getElementById("chart-step_time");
  if (!chart || !page.rank_url || typeof chart.on !== "function") return;

  function rankOf(point) {
    const ranks = (point.data.meta && point.data.meta.ranks) || [];
    const row = Array.isArray(point.pointIndex) ? point.pointIndex[0] : -1;
    return Number.isInteger(ranks[row]) ? ranks[row] : null;
  }

  chart.on("plotly_click", (event) => {
    const rank = event.points && event.points.length ? rankOf(event.points[0]) : null;
    if (rank !== null) window.location.assign(`${page.rank_url}${rank}/`);
  });
})();
