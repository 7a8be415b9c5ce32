// The rank page: draw each figure (json_script) once; the page reloads for another range.
(function () {
  "use strict";
  const CONFIG = { responsive: true, displaylogo: false };
  document.querySelectorAll(".rank-panel").forEach((panel) => {
    const figure = JSON.parse(document.getElementById(panel.dataset.figure).textContent);
    Plotly.newPlot(panel.querySelector(".chart"), figure.data, figure.layout, CONFIG);
  });
})();
