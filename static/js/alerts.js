// Alert rows (tr[data-alert-id]) follow alert.changed messages: state, acknowledgement, and the
// acknowledge form only while firing. An alert the page does not list yet shows a notice.
(function () {
  "use strict";
  function update(row, alert) {
    row.dataset.state = alert.state;
    row.dataset.severity = alert.severity;
    row.querySelector(".state").textContent = alert.state;
    row.querySelector(".severity").textContent = alert.severity;
    row.querySelector(".summary").firstChild.textContent = alert.summary;
    if (alert.state !== "firing") row.querySelector(".ack").replaceChildren();
    const age = row.querySelector(".age");  // "firing for …" no longer holds once resolved
    if (age && alert.state === "resolved") age.textContent = "resolved";
  }

  document.addEventListener("opsboard:alert", (event) => {
    const alert = event.detail.alert;
    const rows = document.querySelectorAll(`tr[data-alert-id="${alert.id}"]`);
    rows.forEach((row) => update(row, alert));
    const notice = document.getElementById("new-alerts");
    if (!rows.length && notice) notice.hidden = false;
  });
})();
