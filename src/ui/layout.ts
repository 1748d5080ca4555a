import { html, raw, type Html } from './html.js';
import { STATECHART_CSS } from './statechart.js';

// The page frame shared by every operator page: navigation, styles, and one small script that
// keeps the numbers fresh by polling /ui/api/counts (and, on pages that ask for it, reloads when
// what they show has changed). Pages work without it; with it they update without a reload.

export type NavKey = 'machines' | 'runs' | 'approvals' | 'push' | 'dependencies' | 'queues';

export type PageOptions = {
  title: string;
  nav?: NavKey | null;
  nonce: string;
  csrf?: string | null;
  /** Who is logged in (the admin token's name). */
  operator?: string | null;
  /** A URL answering {version}; the page reloads when the version changes. */
  liveUrl?: string | null;
  liveVersion?: string | null;
  badges?: { approvals: number; pausedConfigs: number } | null;
  flash?: { kind: 'ok' | 'error'; text: string } | null;
};

const CSS = `
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1f2733; background: #fafbfc; }
header { display: flex; align-items: center; gap: 18px; padding: 10px 20px; background: #1f2733; color: #fff; }
header .brand { font-weight: 700; letter-spacing: .5px; color: #fff; text-decoration: none; }
header nav { display: flex; gap: 4px; flex-wrap: wrap; }
header nav a { color: #c9d1dc; text-decoration: none; padding: 5px 10px; border-radius: 5px; }
header nav a:hover { background: #2f3a4a; color: #fff; }
header nav a.current { background: #3b4a60; color: #fff; }
header .badge { display: inline-block; min-width: 18px; padding: 0 5px; margin-left: 4px; border-radius: 9px; background: #d9822b; color: #fff; font-size: 11px; text-align: center; }
header .badge.zero { display: none; }
header .who { margin-left: auto; display: flex; gap: 10px; align-items: center; color: #c9d1dc; font-size: 13px; }
header .who button { background: none; border: 1px solid #5b6576; color: #fff; border-radius: 5px; padding: 3px 9px; cursor: pointer; }
main { padding: 18px 22px 40px; max-width: 1500px; }
h1 { font-size: 20px; margin: 0 0 12px; }
h2 { font-size: 16px; margin: 26px 0 8px; }
h3 { font-size: 14px; margin: 16px 0 6px; }
a { color: #2a63c7; }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid #e1e5eb; margin: 6px 0 14px; }
th, td { text-align: left; padding: 6px 9px; border-bottom: 1px solid #edf0f4; vertical-align: top; }
th { background: #f2f4f7; font-weight: 600; font-size: 12px; text-transform: uppercase; letter-spacing: .3px; color: #4a5261; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.mono, code, pre { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px; }
pre { background: #f2f4f7; padding: 8px 10px; border-radius: 5px; overflow: auto; max-height: 260px; margin: 4px 0; white-space: pre-wrap; word-break: break-word; }
.muted { color: #6b7585; }
.pill { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; background: #e8ebf0; }
.pill.completed, .pill.delivered, .pill.active, .pill.resolved, .pill.TASK_STATE_COMPLETED { background: #dff3e4; color: #1d6b34; }
.pill.failed, .pill.dead, .pill.stopped, .pill.TASK_STATE_FAILED, .pill.TASK_STATE_REJECTED { background: #fbe3e1; color: #9b2c22; }
.pill.paused, .pill.waiting_for_approval, .pill.waiting_for_input, .pill.pending, .pill.waiting { background: #fdf0dc; color: #8a5300; }
.pill.cancelled, .pill.TASK_STATE_CANCELED, .pill.expired, .pill.superseded { background: #eceef2; color: #4a5261; }
.flash { padding: 9px 12px; border-radius: 6px; margin: 0 0 14px; }
.flash.ok { background: #dff3e4; color: #1d6b34; }
.flash.error { background: #fbe3e1; color: #9b2c22; }
.note { background: #fff8e6; border: 1px solid #f0d9a8; padding: 9px 12px; border-radius: 6px; margin: 8px 0 14px; }
.card { background: #fff; border: 1px solid #e1e5eb; border-radius: 8px; padding: 12px 14px; margin: 0 0 14px; }
.card h3 { margin-top: 0; }
form.inline { display: inline; }
button, .button { font: inherit; padding: 5px 12px; border-radius: 5px; border: 1px solid #5b6576; background: #fff; cursor: pointer; }
button.approve { background: #1d6b34; border-color: #1d6b34; color: #fff; }
button.deny { background: #9b2c22; border-color: #9b2c22; color: #fff; }
button.primary { background: #2a63c7; border-color: #2a63c7; color: #fff; }
form.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: end; background: #fff; border: 1px solid #e1e5eb; padding: 10px 12px; border-radius: 8px; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: #4a5261; gap: 2px; }
input, select { font: inherit; padding: 4px 6px; border: 1px solid #c5ccd6; border-radius: 4px; background: #fff; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0 0 10px; }
dl.facts dt { color: #6b7585; }
dl.facts dd { margin: 0; }
.machines { display: flex; flex-wrap: wrap; gap: 14px; align-items: flex-start; }
.machine { background: #fff; border: 1px solid #e1e5eb; border-radius: 8px; padding: 10px 14px 12px; overflow-x: auto; flex: 0 1 auto; max-width: 100%; }
td.time { white-space: nowrap; }
.machine h2 { margin: 0 0 4px; }
.machine .meta { font-size: 12px; color: #6b7585; margin-bottom: 6px; }
.live { font-size: 12px; color: #6b7585; }
.card.login { max-width: 480px; margin: 40px auto; }
.card.login input[type=password] { width: 100%; }
details summary { cursor: pointer; color: #4a5261; font-size: 12px; }
${STATECHART_CSS}
`;

// Polls the counts (nav badges, statechart numbers, any [data-count-for]) and, where the page
// names a live URL, reloads when its version changes. A 401 sends the browser to the login page.
const SCRIPT = `
(function () {
  var body = document.body;
  var liveUrl = body.getAttribute('data-live-url');
  var liveVersion = body.getAttribute('data-live-version');
  var stamp = document.getElementById('live-stamp');
  var STALE = 'live \\u00b7 changed since loaded: reload to see';
  var stale = false;
  function setCount(el, value) {
    var text = value === null || value === undefined ? '\\u2013' : String(value);
    el.setAttribute('data-count', value === null ? '' : String(value));
    var label = el.querySelector('.count');
    if (label) label.textContent = text; else el.textContent = text;
    if (el.classList) el.classList.toggle('busy', typeof value === 'number' && value > 0);
  }
  function apply(data) {
    var counts = data.counts || {};
    document.querySelectorAll('g.state[data-machine][data-state]').forEach(function (el) {
      var machine = counts[el.getAttribute('data-machine')];
      if (machine) setCount(el, machine[el.getAttribute('data-state')]);
    });
    document.querySelectorAll('[data-count-for]').forEach(function (el) {
      var key = el.getAttribute('data-count-for'), at = key.indexOf(':');
      var machine = counts[key.slice(0, at)];
      if (machine) { var value = machine[key.slice(at + 1)]; el.textContent = value === null || value === undefined ? '\\u2013' : String(value); }
    });
    var badges = data.badges || {};
    document.querySelectorAll('[data-badge]').forEach(function (el) {
      var value = badges[el.getAttribute('data-badge')] || 0;
      el.textContent = String(value);
      el.classList.toggle('zero', value === 0);
    });
    if (stamp) stamp.textContent = stale ? STALE : 'live \\u00b7 updated ' + new Date().toLocaleTimeString();
  }
  function get(url, then) {
    fetch(url, { credentials: 'same-origin', headers: { accept: 'application/json' }, cache: 'no-store' })
      .then(function (response) {
        if (response.status === 401) { window.location.href = '/ui/login?next=' + encodeURIComponent(window.location.pathname + window.location.search); return null; }
        return response.ok ? response.json() : null;
      })
      .then(function (data) { if (data) then(data); })
      .catch(function () { if (stamp) stamp.textContent = 'live \\u00b7 connection lost, retrying'; });
  }
  // A page the operator is working in is not reloaded under their hands: a reload would reset a
  // field they changed, or cancel the POST of a form they just submitted (the click lost). Once a
  // form field changes or a form is submitted, a new version is named in the stamp instead.
  var working = false;
  function markWorking(event) { if (event.target && event.target.form !== undefined) working = true; }
  document.addEventListener('input', markWorking, true);
  document.addEventListener('change', markWorking, true);
  document.addEventListener('submit', function () { working = true; }, true);
  function changed() {
    if (!working) { window.location.reload(); return; }
    stale = true;
    if (stamp) stamp.textContent = STALE;
  }
  function tick() {
    get('/ui/api/counts', apply);
    if (liveUrl) get(liveUrl, function (data) { if (data.version !== liveVersion) changed(); });
  }
  setInterval(tick, 1000);
  tick();
})();
`;

export function page(options: PageOptions, content: Html): string {
  const nav = (key: NavKey, href: string, label: string, badge?: { name: string; value: number }) =>
    html`<a href="${href}" class="${options.nav === key ? 'current' : ''}">${label}${badge ? html`<span class="badge${badge.value === 0 ? ' zero' : ''}" data-badge="${badge.name}">${badge.value}</span>` : ''}</a>`;
  const loggedIn = options.csrf !== undefined && options.csrf !== null;
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="same-origin">
<title>${options.title} · Keel</title>
${loggedIn ? raw('<noscript><meta http-equiv="refresh" content="15"></noscript>') : ''}
<style nonce="${options.nonce}">${raw(CSS)}</style>
</head>
<body${options.liveUrl ? html` data-live-url="${options.liveUrl}" data-live-version="${options.liveVersion ?? ''}"` : ''}>
<header>
  <a class="brand" href="/ui/machines">KEEL</a>
  ${loggedIn
    ? html`<nav>
    ${nav('machines', '/ui/machines', 'Machines')}
    ${nav('runs', '/ui/runs', 'Runs and tasks')}
    ${nav('approvals', '/ui/approvals', 'Approvals', { name: 'approvals', value: options.badges?.approvals ?? 0 })}
    ${nav('push', '/ui/push', 'Push', { name: 'pausedConfigs', value: options.badges?.pausedConfigs ?? 0 })}
    ${nav('dependencies', '/ui/dependencies', 'Dependencies')}
    ${nav('queues', '/ui/queues', 'Queues')}
  </nav>
  <div class="who"><span class="live" id="live-stamp"></span><span>${options.operator ?? ''}</span>
    <form class="inline" method="post" action="/ui/logout"><input type="hidden" name="_csrf" value="${options.csrf}"><button type="submit">Log out</button></form>
  </div>`
    : ''}
</header>
<main>
${options.flash ? html`<div class="flash ${options.flash.kind}" role="status">${options.flash.text}</div>` : ''}
${content}
</main>
${loggedIn ? html`<script nonce="${options.nonce}">${raw(SCRIPT)}</script>` : ''}
</body>
</html>`.text;
}

/** The state of a row as a coloured pill. */
export const pill = (state: string | null | undefined) => (state ? html`<span class="pill ${state}">${state}</span>` : html`<span class="muted">–</span>`);
