// The Pollux dashboard: polls the server's API and redraws in place (no page reload).
// Authentication: opening the page through its ?token= link gave the browser a session
// cookie (pages only) and this page a CSRF token, in the URL fragment; the page keeps it
// in sessionStorage (per origin: no other port's page can read it) and sends it with
// every API request (X-CSRF-Token).
"use strict";

(() => {
  const CSRF_KEY = "pollux-csrf";
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.get("csrf")) {
    sessionStorage.setItem(CSRF_KEY, fragment.get("csrf"));
    history.replaceState(null, "", location.pathname + location.search);
  }
  const sessionHeaders = () => ({"X-CSRF-Token": sessionStorage.getItem(CSRF_KEY) || ""});
  const params = new URLSearchParams(location.search);
  const REFRESH_MS = Math.max(500, Number(params.get("refresh_s") || 2) * 1000);
  const LOG_TAIL_BYTES = 6000;
  const RULE_FIELDS = new Set(["owner", "team"]);  // the fields of the API's rule refusals
  const PALETTE = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2",
                   "#65a30d", "#dc2626", "#4b5563", "#ca8a04"];
  const state = {selected: null, refreshes: 0, colors: new Map(), jobs: new Map()};

  async function api(path, method = "GET") {
    const response = await fetch(path, {method, credentials: "same-origin", cache: "no-store",
                                        headers: {Accept: "application/json",
                                                  ...sessionHeaders()}});
    if (!response.ok) {
      let detail = response.statusText, field = null;
      try {
        const body = await response.json();
        detail = body.detail || detail;
        field = body.field || null;
      } catch (e) { /* not JSON */ }
      const error = new Error(`${response.status} ${detail} (${path})`);
      error.status = response.status;
      error.field = field;
      throw error;
    }
    return response.json();
  }

  function el(tag, attrs, ...children) {
    const element = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "dataset") Object.assign(element.dataset, value);
      else if (key === "style") element.style.cssText = value;
      else element.setAttribute(key, value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) {
        element.append(child instanceof Node ? child : String(child));
      }
    }
    return element;
  }

  function colorOf(jobId) {
    if (!state.colors.has(jobId)) {
      state.colors.set(jobId, PALETTE[state.colors.size % PALETTE.length]);
    }
    return state.colors.get(jobId);
  }

  const dash = "–";
  const number = (value, digits = 0) => value === null || value === undefined ? dash
    : Number(value).toLocaleString(undefined, {maximumFractionDigits: digits});

  function age(seconds) {
    if (seconds < 90) return `${Math.round(seconds)} s`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
    if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
    return `${(seconds / 86400).toFixed(1)} d`;
  }

  function renderHealth(health, cluster) {
    const scaling = cluster.desired_num_nodes !== null && cluster.desired_num_nodes !== undefined
      ? ` · autoscaler ${cluster.autoscaler} wants ${cluster.desired_num_nodes} nodes` : "";
    const speeds = Object.entries(cluster.gpu_type_speeds || {}).sort((a, b) => a[1] - b[1]);
    const typed = speeds.length
      ? ` · GPU type speeds ${speeds.map(([t, s]) => `${t} ${+s.toPrecision(3)}`).join(", ")}`
      : "";
    document.getElementById("health").textContent =
      `policy ${health.policy} · backend ${health.backend} · round every ` +
      `${health.interval_s} s · ${health.rounds} rounds${scaling}${typed}`;
  }

  function renderCards(view) {
    const history = view.history;
    const total = view.nodes.reduce((sum, n) => sum + (n.resources.gpu || 0), 0);
    const used = view.nodes.reduce(
      (sum, n) => sum + Object.values(n.jobs).reduce((a, b) => a + b, 0), 0);
    const active = view.jobs.filter(j => !["Succeeded", "Failed", "Cancelled"].includes(j.state));
    const rounds = history.round_s || [];
    const lastRound = rounds.length
      ? `${PolluxCharts.compact(rounds[rounds.length - 1] * 1000)} ms` : dash;
    const cards = [[`${used} / ${total}`, "slots in use"], [view.nodes.length, "nodes"],
                   [active.length, "active jobs"], [view.jobs.length - active.length, "ended jobs"],
                   [lastRound, "last policy round"]];
    document.getElementById("cards").replaceChildren(
      ...cards.map(([value, label]) => el("div", {class: "card"}, el("b", {}, value),
                                          el("span", {}, label))));
  }

  function renderNodes(nodes) {
    const rows = nodes.map(n => {
      const slots = [];
      for (const [jobId, count] of Object.entries(n.jobs)) {
        for (let i = 0; i < count; i++) {
          slots.push(el("div", {class: "slot", title: `${jobId} on ${n.name}`,
                                style: `background:${colorOf(jobId)}`,
                                dataset: {job: jobId}}, jobId.split("-").pop()));
        }
      }
      const free = Math.max(0, Math.round(n.resources.gpu || 0) - slots.length);
      for (let i = 0; i < free; i++) slots.push(el("div", {class: "slot", title: "free"}));
      const kind = n.gpu_type || (n.labels && n.labels.gpu_type) || null;
      return el("div", {class: "node", dataset: {node: n.name}},
                el("div", {class: "node-name"}, n.name,
                   kind ? el("small", {}, kind) : null,
                   n.preemptible ? el("small", {}, "preemptible") : null),
                el("div", {class: "slots"}, ...slots));
    });
    document.getElementById("nodes").replaceChildren(...rows);
  }

  function renderClusterCharts(history) {
    const times = history.time || [];
    const utilization = times.map((_, i) => history.slots_total[i]
      ? 100 * history.slots_used[i] / history.slots_total[i] : null);
    PolluxCharts.line(document.getElementById("chart-utilization"), {
      times, yMin: 0, yMax: 100, series: [{values: utilization, color: "#2563eb", step: true}]});
    PolluxCharts.line(document.getElementById("chart-round"), {
      times, yMin: 0, series: [{values: (history.round_s || []).map(s => s * 1000),
                                 color: "#d97706"}]});
  }

  function renderJobs(jobs) {
    const body = document.querySelector("#jobs-table tbody");
    const rows = jobs.slice().reverse().map(job => {
      const goodput = job.goodput === null ? dash : `${number(job.goodput, 1)} samples/s`;
      const speedup = job.speedup === null || job.speedup === undefined ? dash
        : `${number(job.speedup, 2)}×`;
      const cells = [
        ["id", el("span", {}, el("span", {class: "swatch", style: `background:${colorOf(job.id)}`}),
                  job.id)],
        ["owner", job.owner || dash], ["team", job.team || dash],
        ["state", el("span", {class: `state ${job.state}`}, job.state)],
        ["replicas", job.replicas],
        ["nodes", job.gpu_type ? `${job.nodes} · ${job.gpu_type}` : job.nodes],
        ["batch_size", number(job.batch_size)],
        ["goodput", goodput], ["speedup", speedup], ["restarts", job.restarts],
        ["age", age(job.age_s)]];
      const row = el("tr", {dataset: {job: job.id, state: job.state}},
                     ...cells.map(([column, value]) => el(
                       "td", {dataset: {col: column},
                              class: ["id", "owner", "team", "state"].includes(column)
                                ? "" : "num"},
                       value)));
      if (job.id === state.selected) row.classList.add("selected");
      row.addEventListener("click", () => select(job.id));
      return row;
    });
    body.replaceChildren(...rows);
    document.getElementById("no-jobs").hidden = jobs.length > 0;
    state.jobs = new Map(jobs.map(job => [job.id, job]));
  }

  function renderTeams(teams) {
    const section = document.getElementById("teams");
    section.hidden = !teams || teams.length === 0;
    if (section.hidden) return;
    const gpus = value => number(value, 1);
    document.querySelector("#teams-table tbody").replaceChildren(...teams.map(team => el(
      "tr", {dataset: {team: team.team}},
      ...[["team", team.team], ["quota", gpus(team.quota_gpus)], ["in_use", gpus(team.in_use_gpus)],
          ["lent", gpus(team.lent_gpus)], ["borrowed", gpus(team.borrowed_gpus)],
          ["pending", gpus(team.pending_gpus)], ["jobs", team.num_jobs]].map(
        ([column, value]) => el("td", {dataset: {col: column},
                                       class: column === "team" ? "" : "num"}, value)))));
  }

  const CHART_IDS = ["chart-replicas", "chart-batch", "chart-goodput", "chart-efficiency"];

  function renderPrivate(jobId, job) {
    // a job this session's user may not read: what every user sees, and why no more
    const section = document.getElementById("job-detail");
    section.hidden = false;
    section.dataset.job = jobId;
    document.getElementById("job-title").textContent = jobId;
    const badge = document.getElementById("job-state");
    badge.textContent = job.state;
    badge.className = `state ${job.state}`;
    document.getElementById("job-cancel").hidden = true;
    document.getElementById("job-reason").textContent = "";
    const note = document.getElementById("job-private");
    note.hidden = false;
    note.textContent = `owned by ${job.owner || "the server's account"}` +
      (job.team ? ` (team ${job.team})` : "") + ": its events, log and details are shown " +
      "to its owner, its team's admins and admins only";
    for (const id of ["job-events", "job-log"]) document.getElementById(id).replaceChildren();
    for (const id of CHART_IDS) PolluxCharts.line(document.getElementById(id), {});
  }

  async function renderDetail() {
    const jobId = state.selected;
    const section = document.getElementById("job-detail");
    if (!jobId) { section.hidden = true; return; }
    const listed = state.jobs.get(jobId);
    if (listed && listed.may_act === false) { renderPrivate(jobId, listed); return; }
    document.getElementById("job-private").hidden = true;
    const [detail, history] = await Promise.all([
      api(`/api/jobs/${encodeURIComponent(jobId)}`),
      api(`/api/jobs/${encodeURIComponent(jobId)}/history`)]);
    if (jobId !== state.selected) return;
    section.hidden = false;
    section.dataset.job = jobId;
    document.getElementById("job-title").textContent = jobId;
    const badge = document.getElementById("job-state");
    badge.textContent = detail.state;
    badge.className = `state ${detail.state}`;
    document.getElementById("job-cancel").hidden =
      ["Succeeded", "Failed", "Cancelled", "Cancelling"].includes(detail.state);
    document.getElementById("job-reason").textContent =
      `${detail.spec.min_replicas}–${detail.spec.max_replicas} replicas · ` +
      `${detail.launches} launches · ${detail.rescales} rescales · ${detail.failures} failures` +
      (detail.gpu_type ? ` · GPU type ${detail.gpu_type}` : "") +
      (detail.spec.priority ? ` · priority ${detail.spec.priority}` : "") +
      (detail.reason ? ` · ${detail.reason}` : "");
    const samples = history.samples;
    const times = samples.time || [];
    const color = colorOf(jobId);
    const chart = (id, values, options) => PolluxCharts.line(
      document.getElementById(id), {times, series: [{values: values || [], color, ...options}],
                                    yMin: 0, ...options});
    chart("chart-replicas", samples.replicas, {step: true});
    chart("chart-batch", samples.batch_size, {step: true});
    chart("chart-goodput", samples.goodput, {});
    chart("chart-efficiency", samples.efficiency, {yMax: 1});
    document.getElementById("job-events").replaceChildren(...detail.events.map(e => el(
      "li", {dataset: {kind: e.kind}}, el("span", {class: "muted"}, PolluxCharts.clock(e.time)),
      " ", el("span", {class: "kind"}, e.kind), " ", e.message)));
    await renderLog(jobId);
  }

  async function renderLog(jobId) {
    const pre = document.getElementById("job-log");
    let text = "(no log yet)";
    try {
      const chunk = await api(`/api/jobs/${encodeURIComponent(jobId)}/logs?replica=0` +
                              `&offset=-${LOG_TAIL_BYTES}&limit=${LOG_TAIL_BYTES}`);
      text = chunk.offset > 0 ? chunk.text.slice(chunk.text.indexOf("\n") + 1) : chunk.text;
    } catch (error) { if (!String(error.message).startsWith("404")) throw error; }
    if (jobId !== state.selected) return;  // another job was selected meanwhile
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    if (pre.textContent !== text) {
      pre.textContent = text;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
  }

  function select(jobId) {
    state.selected = jobId;
    for (const row of document.querySelectorAll("#jobs-table tbody tr")) {
      row.classList.toggle("selected", row.dataset.job === jobId);
    }
    renderDetail().catch(showError);
  }

  function showError(error) {
    const box = document.getElementById("error");
    // a 403 about a job or a team is a rule of who may do what, not the session's end
    const refused = error.status === 403 && RULE_FIELDS.has(error.field);
    if (refused) {
      box.textContent = `not allowed: ${error.message}`;
    } else if (error.status === 401 || error.status === 403) {
      box.textContent = "not signed in, or the session has expired: open a new link from " +
        `'pollux dashboard' (or /?token=<token>). The server said: ${error.message}`;
    } else {
      box.textContent = error.status ? `the server refused: ${error.message}`
                                     : `cannot reach the server: ${error.message}`;
    }
    box.hidden = false;
  }

  async function refresh() {
    try {
      const view = await api("/api/dashboard");
      renderHealth(view.health, view.cluster);
      renderCards(view);
      renderNodes(view.nodes);
      renderClusterCharts(view.history);
      renderJobs(view.jobs);
      renderTeams(view.teams);
      document.getElementById("whoami").textContent =
        view.user ? `signed in as ${view.user}` : "";
      await renderDetail();
      document.getElementById("error").hidden = true;
      state.refreshes += 1;
      const updated = document.getElementById("updated");
      updated.dataset.refreshes = state.refreshes;
      updated.textContent = `updated ${PolluxCharts.clock(view.time)}`;
    } catch (error) {
      showError(error);
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  document.getElementById("job-close").addEventListener("click", () => select(null));
  document.getElementById("job-cancel").addEventListener("click", () => {
    const jobId = state.selected;
    if (!jobId || !window.confirm(`Cancel job ${jobId}?`)) return;
    api(`/api/jobs/${encodeURIComponent(jobId)}/cancel`, "POST")
      .then(renderDetail).catch(showError);
  });
  document.getElementById("metrics-link").addEventListener("click", event => {
    event.preventDefault();  // a plain link would send the cookie only: no metrics
    fetch("/metrics", {credentials: "same-origin", cache: "no-store", headers: sessionHeaders()})
      .then(response => response.text())
      .then(text => window.open(URL.createObjectURL(new Blob([text], {type: "text/plain"}))))
      .catch(showError);
  });
  if (params.get("job")) state.selected = params.get("job");
  refresh();
})();
