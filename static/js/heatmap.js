// The run page's heat-map: a click on a rank's row opens that rank's page. The figure's
// meta.ranks names the rank of each row (its labels carry node and GPU too). The page
// fetches the figure after load (charts.js), so the click is watched once it is drawn.
(function () {
  "use strict";
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const chart = document.getElementById("chart-step_time");
  if (!chart || !page.rank_url) return;

  function rankOf(point) {
    const ranks = (point.data.meta && point.data.meta.ranks) || [];
    const row = Array.isArray(point.pointIndex) ? point.pointIndex[0] : -1;
    return Number.isInteger(ranks[row]) ? ranks[row] : null;
  }

  function watchClicks() {
    chart.on("plotly_click", (event) => {
      const rank = event.points && event.points.length ? rankOf(event.points[0]) : null;
      if (rank !== null) window.location.assign(`${page.rank_url}${rank}/`);
    });
  }

  // charts.js fetches the heat-map after load: Plotly's events exist once it is drawn
  if (typeof chart.on === "function") watchClicks();
  else chart.addEventListener("opsboard:drawn", watchClicks, { once: true });
})();
