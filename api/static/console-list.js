// The export list: live refresh by polling the server-rendered rows and the counts (no build step), and bulk cancel with
// a confirmation that shows how many live exports match before anything is recorded. The confirmation
// submits the preview's token, so the batch covers exactly the exports it counted: one queued after the
// review is not touched, and the answer names it. A bulk cancel's batch ID is made once per confirmed
// action and reused on retry, so a retry records nothing twice.
(function () {
  "use strict";
  const headers = { "Content-Type": "application/json", "X-Console-Request": "1" };
  const rows = document.getElementById("rows");
  const live = document.getElementById("live");
  const $ = (id) => document.getElementById(id);

  function newId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  // -- live refresh: the same query, rows only -------------------------------------------------------
  let refreshing = false;
  async function refresh() {
    if (!live.checked || refreshing || document.hidden) return;
    refreshing = true;
    try {
      const response = await fetch("/console/rows" + window.location.search, { credentials: "same-origin" });
      if (response.status === 401) { window.location.href = "/console/login"; return; }
      if (response.ok) rows.innerHTML = await response.text();
    } catch (err) {
      // The next tick tries again.
    } finally {
      refreshing = false;
    }
  }
  setInterval(refresh, 2000);

  // -- how many match: the same filters' counts, refreshed every fifth tick (each is a bounded read) -----
  const matchCount = $("match-count");
  const countsUrl = matchCount && matchCount.dataset.countsUrl;
  let countsTick = 0;
  function showCount(element, count) {
    element.textContent = count.text;
    element.title = count.note;
    element.dataset.kind = count.kind;
    element.className = "count count-" + count.kind;
  }
  async function refreshCounts() {
    if (!countsUrl || !live.checked || document.hidden || ++countsTick % 5 !== 0) return;
    try {
      const response = await fetch(countsUrl, { headers, credentials: "same-origin" });
      if (!response.ok) return;
      const body = await response.json();
      showCount($("match-total"), body.matching);
      const one = body.matching.kind === "exact" && body.matching.count === 1;
      $("match-noun").textContent = one ? "export matches" : "exports match";
      $("count-note").textContent = body.timed_out
        ? `(counting exactly took longer than ${body.timeout_ms.toLocaleString("en-US")} ms: the rest are estimates)`
        : body.matching.kind === "exact" ? "" : "(not exact where counting exactly would take too long: hover a count to see why)";
      for (const chip of document.querySelectorAll(".chip .count[data-status]")) {
        const count = body.by_status[chip.dataset.status];
        if (count) showCount(chip, count);
      }
    } catch (err) {
      // The next tick tries again.
    }
  }
  setInterval(refreshCounts, 2000);

  // -- bulk cancel -------------------------------------------------------------------------------------
  const confirmBox = $("bulk-confirm");
  const result = $("bulk-result");
  const retry = $("bulk-retry");
  let pending = null; // {batch_id, destination_id, list_name, reason, preview_token}: reused until every export is decided

  function filter() {
    const list = $("bulk-list").value.trim();
    return { destination_id: $("bulk-destination").value, list_name: list || null };
  }

  $("bulk-review").addEventListener("click", async () => {
    const reason = $("bulk-reason").value.trim();
    result.textContent = "";
    if (!reason) { result.textContent = "Give a reason: it is recorded with the batch and every request."; return; }
    const f = filter();
    const params = new URLSearchParams({ destination_id: f.destination_id });
    if (f.list_name) params.set("list_name", f.list_name);
    const response = await fetch("/cancellation-batches/preview?" + params, { headers, credentials: "same-origin" });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) { result.textContent = body.detail || `Unexpected answer ${response.status}.`; return; }
    const s = body.by_status;
    const where = $("bulk-destination").selectedOptions[0].textContent + (f.list_name ? `, list ${f.list_name}` : "");
    $("bulk-count").textContent = body.matching === 0
      ? `No live export of ${where} matches.`
      : `${body.matching} live export${body.matching === 1 ? "" : "s"} of ${where} match: ` +
        `${s.Queued} queued, ${s.Running} running, ${s.Delivering} delivering (too late to stop). ` +
        "Each gets its own cancellation request with this reason; an export queued after this review is not " +
        "included (review again to include it).";
    $("bulk-go").hidden = body.matching === 0;
    $("bulk-go").textContent = `Cancel ${body.matching} export${body.matching === 1 ? "" : "s"}`;
    confirmBox.hidden = false;
    pending = { batch_id: newId(), ...f, reason, preview_token: body.preview_token };
  });

  $("bulk-back").addEventListener("click", () => { confirmBox.hidden = true; pending = null; });

  async function submit() {
    if (!pending) return;
    $("bulk-go").disabled = retry.disabled = true;
    let response;
    try {
      response = await fetch("/cancellation-batches", {
        method: "POST", headers, credentials: "same-origin", body: JSON.stringify(pending),
      });
    } catch (err) {
      result.textContent = `No answer from the server: retry; it reuses batch ${pending.batch_id}.`;
      retry.hidden = false;
      return;
    } finally {
      $("bulk-go").disabled = retry.disabled = false;
    }
    const body = await response.json().catch(() => ({}));
    confirmBox.hidden = true;
    result.dataset.batch = pending.batch_id;
    if (response.status === 202 || response.status >= 500) {
      result.textContent = (body.message || body.detail || "The server could not answer.") +
        (body.busy ? ` Busy: ${body.busy.map((b) => b.export_id.slice(0, 8)).join(", ")}.` : "");
      retry.hidden = false; // the same batch ID: recorded outcomes replay, only the busy ones are decided
      return;
    }
    result.textContent = body.message || body.detail || `Unexpected answer ${response.status}.`;
    retry.hidden = true;
    pending = null;
    refresh();
  }
  $("bulk-go").addEventListener("click", submit);
  retry.addEventListener("click", submit);
})();
