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
      // a scope's row (data-scope), or one active pause's row (data-pause-scope, and the pause it names)
      const body = { scope: row.dataset.scope || row.dataset.pauseScope, reason };
      const destination = row.dataset.destination || row.dataset.pauseDestination;
      if (destination) body.destination_id = destination;
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
