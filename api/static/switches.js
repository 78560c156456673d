// The switches page: Pause / Resume post to the JSON API as the console does for Cancel (the session's
// cookie plus the X-Console-Request header a cross-site form cannot send), show the answer, then reload.
(function () {
  "use strict";
  const message = document.getElementById("switch-message");
  const headers = { "Content-Type": "application/json", "X-Console-Request": "1" };
  for (const button of document.querySelectorAll("button.switch-action")) {
    button.addEventListener("click", async () => {
      const row = button.closest("tr");
      const reason = row.querySelector("input.switch-reason").value.trim();
      if (!reason) {
        message.textContent = "Give a reason: it is recorded with the change.";
        return;
      }
      const body = { scope: row.dataset.scope, reason };
      if (row.dataset.destination) body.destination_id = row.dataset.destination;
      if (row.dataset.pause) body.pause_id = row.dataset.pause;
      button.disabled = true;
      try {
        const response = await fetch(`/switches/${button.dataset.action}`, {
          method: "POST", headers, credentials: "same-origin", body: JSON.stringify(body),
        });
        const answer = await response.json();
        message.textContent = answer.message || answer.detail || `HTTP ${response.status}`;
        if (response.ok) setTimeout(() => window.location.reload(), 1500);
      } catch (err) {
        message.textContent = "No answer from the server: the switch may or may not have changed; reload to see.";
      } finally {
        button.disabled = false;
      }
    });
  }
})();
