// The webhook pages: Register, Enable/Disable and Redeliver post to the JSON API as the console does for
// Cancel (the session's cookie plus the X-Console-Request header a cross-site form cannot send).
(function () {
  "use strict";
  const message = document.getElementById("webhook-message");
  const headers = { "Content-Type": "application/json", "X-Console-Request": "1" };
  async function call(method, path, body, extra) {
    const response = await fetch(path, {
      method, headers: { ...headers, ...(extra || {}) }, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let answer = {};
    try { answer = await response.json(); } catch (err) { answer = {}; }
    return { response, answer };
  }
  function say(text) { if (message) message.textContent = text; }

  const form = document.getElementById("new-endpoint");
  if (form) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const data = new FormData(form);
      const body = { url: data.get("url"), events: data.getAll("events") };
      const description = (data.get("description") || "").trim();
      if (description) body.description = description;
      try {
        const { response, answer } = await call("POST", "/webhook-endpoints", body);
        if (response.ok) {
          document.getElementById("new-secret-value").textContent = answer.secret;
          document.getElementById("new-secret").hidden = false;
          say(answer.message || "Registered.");
        } else {
          say(answer.detail || `HTTP ${response.status}`);
        }
      } catch (err) {
        say("No answer from the server: reload to see whether the endpoint was registered.");
      }
    });
  }

  const endpoint = document.getElementById("endpoint");
  const toggle = document.getElementById("toggle-endpoint");
  if (endpoint && toggle) {
    toggle.addEventListener("click", async () => {
      toggle.disabled = true;
      try {
        const enabled = toggle.dataset.enabled !== "true";
        const { response, answer } = await call(
          "PATCH", `/webhook-endpoints/${endpoint.dataset.endpoint}`, { enabled },
          { "If-Match": `"${endpoint.dataset.version}"` });
        say(response.ok ? (enabled ? "Enabled." : "Disabled.") : (answer.detail || `HTTP ${response.status}`));
        if (response.ok) setTimeout(() => window.location.reload(), 800);
      } finally {
        toggle.disabled = false;
      }
    });
  }
  for (const button of document.querySelectorAll("button.redeliver")) {
    button.addEventListener("click", async () => {
      const row = button.closest("tr");
      button.disabled = true;
      try {
        const { response, answer } = await call(
          "POST", `/webhook-endpoints/${endpoint.dataset.endpoint}/deliveries/${row.dataset.delivery}/redelivery`);
        say(answer.message || answer.detail || `HTTP ${response.status}`);
      } catch (err) {
        say("No answer from the server: the redelivery may or may not be queued; reload to see.");
      } finally {
        button.disabled = false;
      }
    });
  }
})();
