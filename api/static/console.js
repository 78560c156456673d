// The Cancel button: a fresh request ID per click, the same ID again after Busy or a lost answer
// (the retry then returns whatever an earlier submission recorded). Then poll the export until the
// attempt records how it ended, and show the message the server derives from the records.
// Without a Cancel button (a stop already requested, or the export ended) the page still follows an
// export that has not settled.
(function () {
  "use strict";
  const button = document.getElementById("cancel");
  const statusBadge = document.getElementById("status");
  if (!statusBadge) return;
  const exportId = statusBadge.dataset.export;
  const message = document.getElementById("message");
  const pending = document.getElementById("pending");
  const statusLine = document.getElementById("status-line");
  const settled = ["Canceled", "Rejected", "Stopped", "Failed", "Completed", "OutcomeUnknown"];
  const headers = { "Content-Type": "application/json", "X-Console-Request": "1" };
  let retryId = null;
  let polling = false;

  function newRequestId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  function show(text, outcome) {
    message.textContent = text;
    message.dataset.outcome = outcome || "";
  }

  function renderTimeline(entries) {
    const body = document.querySelector("#timeline tbody");
    if (!body) return;
    body.replaceChildren();
    for (const e of entries) {
      const row = document.createElement("tr");
      row.className = "entry entry-" + e.label.toLowerCase();
      const cells = [e.label, e.subject_short, e.actor, e.when, e.detail];
      cells.forEach((text, i) => {
        const cell = document.createElement(i === 0 ? "th" : "td");
        cell.textContent = text;
        if (i === 1) cell.title = e.subject;
        if (i === 3) cell.className = "time";
        if (i === 4) for (const line of e.more) {
          const div = document.createElement("div");
          div.className = "more";
          div.textContent = line;
          cell.appendChild(div);
        }
        row.appendChild(cell);
      });
      body.appendChild(row);
    }
  }

  function refresh(view) {
    const status = view.export.status;
    statusBadge.textContent = status;
    statusBadge.className = "status status-" + status;
    statusLine.textContent = view.status_line;
    if (view.message) show(view.message, message.dataset.outcome);
    renderTimeline(view.timeline);
    return settled.includes(status);
  }

  async function poll() {
    if (polling) return;
    polling = true;
    try {
      for (let i = 0; i < 300; i++) {
        await new Promise((resolve) => setTimeout(resolve, 1000));
        const response = await fetch(`/exports/${exportId}`, { headers, credentials: "same-origin" });
        if (!response.ok) continue;
        if (refresh(await response.json())) break;
      }
    } finally {
      polling = false;
    }
  }

  if (!button) {
    if (!settled.includes(statusBadge.textContent.trim())) poll();
    return;
  }

  button.addEventListener("click", async () => {
    const requestId = retryId || newRequestId();
    retryId = requestId;
    button.disabled = true;
    const reason = document.getElementById("reason").value.trim();
    let response;
    try {
      response = await fetch(`/exports/${exportId}/cancellations`, {
        method: "POST",
        headers,
        credentials: "same-origin",
        body: JSON.stringify({ request_id: requestId, reason: reason || null }),
      });
    } catch (err) {
      show("No answer from the server: nothing is known about this click. Click Cancel again to retry the same request.", "");
      pending.textContent = `A retry reuses request ${requestId}.`;
      button.disabled = false;
      return;
    }
    const body = await response.json().catch(() => ({}));
    button.disabled = false;
    if (response.status === 503 || response.status >= 500) {
      show(body.message || body.detail || "The server could not answer. Click Cancel again to retry.", body.outcome);
      pending.textContent = `A retry reuses request ${requestId}.`;
      return;
    }
    retryId = null;
    pending.textContent = "";
    if (response.status === 401) {
      window.location.href = "/console/login";
      return;
    }
    show(body.message || body.detail || `Unexpected answer ${response.status}.`, body.outcome);
    // A recorded answer: follow the export until its attempt records how it ended.
    if ([200, 202, 409].includes(response.status)) poll();
  });
})();
