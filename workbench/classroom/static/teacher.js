// The teacher's page: fetch the class table (api/progress) every few seconds and draw it.
// Every value from the server is written with textContent: a student's exercise name or
// user name can never become markup here.
"use strict";

const REFRESH_MS = 5000;
const groupSelect = document.getElementById("group");
const statusLine = document.getElementById("status");
const csvLink = document.getElementById("csv");
const table = document.getElementById("progress");
// JupyterHub checks XSRF on every script request a login cookie authenticates, GETs included.
const XSRF = document.querySelector('meta[name="xsrf-token"]').content;
let group = new URLSearchParams(location.search).get("group") || "";
let latest = null;

function cell(tag, text, className, attributes) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  return node;
}

function ago(when) {
  if (!when) return "never";
  const seconds = Math.max(0, (Date.now() - Date.parse(when)) / 1000);
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return new Date(when).toLocaleDateString();
}

function showGroups(groups) {
  const wanted = ["", ...groups];
  const have = [...groupSelect.options].map((option) => option.value);
  if (wanted.join("\n") !== have.join("\n")) {
    groupSelect.replaceChildren(...wanted.map((name) => {
      const option = cell("option", name || "everyone");
      option.value = name;
      return option;
    }));
  }
  groupSelect.value = groups.includes(group) ? group : "";
}

function render(data) {
  latest = data;
  showGroups(data.groups);
  const students = data.students.filter((s) => !group || s.groups.includes(group));
  const exercises = data.exercises;

  // Two header rows: the notebook over its exercises, then the exercises.
  const notebooks = [];
  for (const ex of exercises) {
    const last = notebooks[notebooks.length - 1];
    const label = `${ex.course} · ${ex.notebook}`;
    if (last && last.label === label) last.span += 1;
    else notebooks.push({ label, span: 1 });
  }
  const top = cell("tr");
  top.append(cell("th", "", "", { colspan: "4" }));
  for (const nb of notebooks) top.append(cell("th", nb.label, "notebook", { colspan: String(nb.span) }));
  const names = cell("tr");
  for (const title of ["Student", "Groups", "Last activity", "Passed"]) names.append(cell("th", title));
  for (const ex of exercises) names.append(cell("th", ex.exercise, "exercise"));
  table.tHead.replaceChildren(top, names);

  const rows = students.map((student) => {
    const row = cell("tr", null, "", { "data-student": student.name });
    const passed = exercises.filter((ex) => student.cells[ex.key]?.status === "passed").length;
    row.append(cell("td", student.name, "student"), cell("td", student.groups.join(", "), "groups"),
               cell("td", ago(student.last_activity), "activity", { title: student.last_activity || "" }),
               cell("td", `${passed}/${exercises.length}`, "count"));
    for (const ex of exercises) {
      const result = student.cells[ex.key];
      const status = result ? result.status : "notyet";
      const text = !result ? "·" : result.status === "passed" ? "✓" : `✗ ${result.attempts}`;
      const title = !result ? "not tried yet"
        : `${result.attempts} attempt(s); last ${result.last_passed ? "passed" : "failed"} ${ago(result.last_attempt_at)}`
          + (result.first_pass_at ? `; first passed ${new Date(result.first_pass_at).toLocaleString()}` : "");
      row.append(cell("td", text, status, { "data-exercise": ex.exercise, "data-status": status, title }));
    }
    return row;
  });
  table.tBodies[0].replaceChildren(...rows);

  const totals = cell("tr");
  totals.append(cell("td", `${students.length} student(s)`, "", { colspan: "4" }));
  for (const ex of exercises) {
    const done = students.filter((s) => s.cells[ex.key]?.status === "passed").length;
    totals.append(cell("td", `${done}/${students.length}`, "", { "data-total": ex.exercise }));
  }
  table.tFoot.replaceChildren(totals);
  document.getElementById("empty").hidden = exercises.length > 0;
  csvLink.href = "progress.csv" + (group ? `?group=${encodeURIComponent(group)}` : "");
}

groupSelect.addEventListener("change", () => {
  group = groupSelect.value;
  const url = new URL(location.href);
  if (group) url.searchParams.set("group", group);
  else url.searchParams.delete("group");
  history.replaceState(null, "", url);
  if (latest) render(latest);
});

async function refresh() {
  try {
    const response = await fetch("api/progress", {
      credentials: "same-origin", cache: "no-store", headers: { "X-XSRFToken": XSRF } });
    if (response.status === 403) {
      statusLine.textContent = "Your login has ended: reload the page.";
      return; // no more polling until the teacher logs in again
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    render(data);
    const roster = data.roster_from_hub ? "" : " (the hub's class list is unavailable: only students with results)";
    statusLine.textContent = `${data.teacher} · updated ${new Date().toLocaleTimeString()}${roster}`;
    statusLine.dataset.updated = String(Date.now());
  } catch (error) {
    statusLine.textContent = `could not refresh (${error.message}); trying again`;
  }
  setTimeout(refresh, REFRESH_MS);
}

refresh();
