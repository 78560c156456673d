// The evidence page's actions post as the console's other buttons do (the session's cookie plus the
// X-Console-Request header a cross-site form cannot send): reconcile and replace to the JSON API, a correction
// request to the console's own route (service.reconciliation.request_correction), today's listing to
// /exports/{id}/listing-requests. While a listing waits for recovery, the page follows the evidence and
// reloads when the answer is there.
(function () {
  "use strict";
  const section = document.getElementById("evidence-section");
  if (!section) return;
  const exportId = section.dataset.export;
  const message = document.getElementById("action-message");
  const headers = { "Content-Type": "application/json", "X-Console-Request": "1" };

  function say(text) { if (message) message.textContent = text; }

  async function post(path, body) {
    const response = await fetch(path, {
      method: "POST", headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let answer = {};
    try { answer = await response.json(); } catch (err) { answer = {}; }
    return { response, answer };
  }

  function trimmed(data, name) {
    const value = (data.get(name) || "").toString().trim();
    return value === "" ? null : value;
  }

  function submitting(form, path, bodyOf, done) {
    if (!form) return;
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const button = form.querySelector("button[type=submit]");
      button.disabled = true;
      try {
        const { response, answer } = await post(path, bodyOf(new FormData(form)));
        if (response.ok) {
          done(answer);
          setTimeout(() => window.location.reload(), 1200);
        } else {
          say(answer.detail || `HTTP ${response.status}`);
        }
      } catch (err) {
        say("No answer from the server: reload to see whether it was recorded.");
      } finally {
        button.disabled = false;
      }
    });
  }

  const reconcile = document.getElementById("reconcile");
  submitting(reconcile, `/exports/${exportId}/reconciliation`, (data) => ({
    resolution: data.get("resolution"),
    evidence_summary: trimmed(data, "evidence_summary"),
    attempt_id: reconcile.dataset.attempt,
  }), (answer) => {
    const e = answer.export || {};
    say(`Reconciled: ${e.status}${e.failure_reason ? " " + e.failure_reason : ""}.`);
  });

  const replace = document.getElementById("replace");
  submitting(replace, `/exports/${exportId}/replacements`, (data) => {
    const body = { reason: trimmed(data, "reason") };
    const agreement = trimmed(data, "overwrite_agreement_ref");
    if (agreement) body.overwrite_agreement_ref = agreement;
    return body;
  }, (answer) => {
    const e = answer.export || {};
    say(`Replacement ${e.id} created (${e.status}).`);
  });

  const correct = document.getElementById("correct");
  submitting(correct, `/console/reconciliation/${exportId}/correction`, (data) => {
    const recorded = correct.dataset.recorded;
    const corrected = recorded === "Completed" ? "Failed" : "Completed";
    return {
      recorded_status: recorded,
      corrected_status: corrected,
      failure_reason: corrected === "Failed" ? data.get("failure_reason") : null,
      evidence_ref: trimmed(data, "evidence_ref"),
      why: trimmed(data, "why"),
      attempt_id: correct.dataset.attempt,
    };
  }, (answer) => {
    const e = answer.export || {};
    say(answer.message || `Corrected: ${e.status}.`);
  });

  const listing = document.getElementById("request-listing");
  if (listing) {
    listing.addEventListener("click", async () => {
      listing.disabled = true;
      try {
        const { response, answer } = await post(`/exports/${exportId}/listing-requests`);
        say(answer.message || answer.detail || `HTTP ${response.status}`);
        if (response.ok) setTimeout(() => window.location.reload(), 800);  // then it shows, and is followed
      } catch (err) {
        say("No answer from the server: reload to see whether the listing was asked.");
      } finally {
        listing.disabled = false;
      }
    });
  }

  // Follow a waiting listing: read the evidence until no request waits, then show it.
  let following = false;
  function follow() {
    if (following) return;
    following = true;
    const timer = setInterval(async () => {
      try {
        const response = await fetch(`/exports/${exportId}/evidence`, { credentials: "same-origin" });
        if (!response.ok) return;
        const body = await response.json();
        if (!(body.listing_requests || []).some((r) => r.waiting)) {
          clearInterval(timer);
          window.location.reload();
        }
      } catch (err) { /* the next tick asks again */ }
    }, 2000);
  }
  if (section.dataset.waiting === "true") follow();
})();
