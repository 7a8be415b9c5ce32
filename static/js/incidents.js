// The incidents page follows the live feed: an alert change naming an incident (one listed
// or a new one) changes what the table says, so the page offers a reload rather than
// re-deriving the incident (its root and GPU-hours are the server's to compute).
(function () {
  "use strict";
  document.addEventListener("opsboard:alert", (event) => {
    const alert = event.detail.alert;
    if (alert.incident === null || alert.incident === undefined) return;
    const row = document.querySelector(`tr[data-incident-id="${alert.incident}"]`);
    if (row) row.dataset.changed = "true";
    const notice = document.getElementById("incidents-changed");
    if (notice) notice.hidden = false;
  });
})();
