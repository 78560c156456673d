// The approvals page: Approve / Decline post to the JSON API as the console does for Cancel (the session's
// cookie plus the X-Console-Request header a cross-site form cannot send), show the answer, then reload.
(function () {
  "use strict";
  const message = document.getElementById("approval-message");
  const headers = { "Content-Type": "application/json", "X-Console-Request": "1" };
  for (const button of document.querySelectorAll("button.approval-action")) {
    button.addEventListener("click", async () => {
      const row = button.closest("tr");
      const reason = row.querySelector("input.approval-reason").value.trim();
      if (button.dataset.action === "refusal" && !reason) {
        message.textContent = "Give a reason to decline: it is recorded with the decision.";
        return;
      }
      button.disabled = true;
      try {
        const response = await fetch(`/approvals/${row.dataset.id}/${button.dataset.action}`, {
          method: "POST", headers, credentials: "same-origin", body: JSON.stringify(reason ? { reason } : {}),
        });
        const answer = await response.json();
        message.textContent = answer.message || answer.detail || `HTTP ${response.status}`;
        if (response.ok) setTimeout(() => window.location.reload(), 1500);
      } catch (err) {
        message.textContent = "No answer from the server: the approval may or may not have run; reload to see.";
      } finally {
        button.disabled = false;
      }
    });
  }
})();
