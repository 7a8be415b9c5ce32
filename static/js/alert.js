// The alert page: draw the evidence figure (json_script) with Plotly, and follow the alert's
// live changes (state, summary; the acknowledge form only while it fires).
(function () {
  "use strict";
  const source = document.getElementById("figure-evidence");
  const chart = document.getElementById("chart-evidence");
  if (source && chart && window.Plotly) {
    const figure = JSON.parse(source.textContent);
    Plotly.newPlot(chart, figure.data, figure.layout, { responsive: true, displaylogo: false });
  }
  const article = document.getElementById("alert");
  document.addEventListener("opsboard:alert", (event) => {
    const alert = event.detail.alert;
    if (!article || String(alert.id) !== article.dataset.alertId) return;
    article.dataset.state = alert.state;
    article.dataset.severity = alert.severity;
    document.getElementById("alert-state").textContent = alert.state;
    document.getElementById("alert-summary").textContent = alert.summary;
    const form = document.getElementById("alert-ack");
    if (form && alert.state !== "firing") form.remove();
  });
})();
