import { formatDuration, segmentKindText, type RunTimeline, type TimelineSegment } from '../runs/run-timeline.js';
import { html, raw, escapeHtml, type Html } from './html.js';

// A run's timeline drawn to scale, one row per segment (like the timeline view of a durable
// execution engine): server-rendered SVG with presentation attributes only, no script and no
// external asset, so it shows under the operator pages' Content-Security-Policy as it is.

/** Rows drawn at most; a longer run says how many more `keel runs timeline` prints. */
export const MAX_CHART_ROWS = 300;

const LABEL_WIDTH = 300;
const BAR_WIDTH = 640;
const ROW_HEIGHT = 18;
const AXIS_HEIGHT = 22;
const TICKS = 5;

/** A round tick interval (1, 2 or 5 × a power of ten ms) giving at most TICKS intervals over `span`. */
export function tickStep(span: number): number {
  const rough = span / TICKS;
  const power = 10 ** Math.floor(Math.log10(Math.max(1, rough)));
  return [1, 2, 5, 10].map((factor) => factor * power).find((candidate) => candidate >= rough) ?? 10 * power;
}

const FILL: Record<string, string> = {
  state: '#7a9cc6',
  step: '#5aa469',
  'wait(input)': '#e0a030',
  'wait(approval)': '#d9822b',
  'wait(timer)': '#b9a13a',
  'wait(dependency)': '#c27c9e',
  retry: '#c8553d',
  requeue: '#8a6fb0',
  refused: '#a03030',
};

const clip = (text: string, max: number) => (text.length > max ? `${text.slice(0, max - 1)}…` : text);

export function runTimelineChart(timeline: RunTimeline): Html {
  if (timeline.segments.length === 0) return html`<p class="muted" id="run-timeline-empty">Nothing recorded to draw.</p>`;
  const shown = timeline.segments.slice(0, MAX_CHART_ROWS);
  const span = Math.max(1, timeline.end - timeline.start);
  const x = (at: number) => LABEL_WIDTH + ((at - timeline.start) / span) * BAR_WIDTH;
  const width = LABEL_WIDTH + BAR_WIDTH + 90;
  const height = AXIS_HEIGHT + shown.length * ROW_HEIGHT + 4;
  const parts: string[] = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" id="run-timeline" class="run-timeline" role="img" aria-label="timeline of the run" ` +
      `viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" font-family="sans-serif" font-size="11">`,
  );
  const step = tickStep(span);
  for (let offset = 0; offset <= span; offset += step) {
    const at = timeline.start + offset;
    const tx = x(at);
    parts.push(`<line x1="${tx.toFixed(1)}" y1="${AXIS_HEIGHT - 4}" x2="${tx.toFixed(1)}" y2="${height}" stroke="#e1e5eb"/>`);
    parts.push(`<text x="${tx.toFixed(1)}" y="${AXIS_HEIGHT - 8}" text-anchor="middle" fill="#6b7585">+${escapeHtml(formatDuration(at - timeline.start))}</text>`);
  }
  shown.forEach((segment, index) => parts.push(row(segment, index, x, timeline)));
  parts.push('</svg>');
  const more = timeline.segments.length - shown.length;
  const kinds = [...new Set(shown.map(segmentKindText))];
  const swatch = (kind: string) => raw(`<svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" rx="2" fill="${FILL[kind] ?? '#999'}"/></svg>`);
  return html`<div class="machine">${raw(parts.join(''))}
<p class="muted" id="run-timeline-legend">${kinds.map((kind) => html`${swatch(kind)} ${kind} &nbsp; `)}a dashed outline: not over yet.</p></div>
${more > 0 ? html`<p class="muted">${more} more segments: <code>keel runs timeline</code> prints them all.</p>` : ''}`;
}

function row(segment: TimelineSegment, index: number, x: (at: number) => number, timeline: RunTimeline): string {
  const kind = segmentKindText(segment);
  const y = AXIS_HEIGHT + index * ROW_HEIGHT;
  const left = x(segment.start);
  const barWidth = Math.max(2, x(segment.end) - left);
  const duration = `${formatDuration(segment.end - segment.start)}${segment.open ? ' so far' : ''}`;
  const title = `${kind} ${segment.label}: +${formatDuration(segment.start - timeline.start)}, ${duration}`;
  const open = segment.open ? ' stroke="#333" stroke-dasharray="3 2"' : '';
  return (
    `<g class="segment" data-kind="${escapeHtml(kind)}" data-open="${segment.open}"><title>${escapeHtml(title)}</title>` +
    `<text x="4" y="${y + 13}" fill="#1f2733">${escapeHtml(clip(`${kind} ${segment.label}`, 46))}</text>` +
    `<rect x="${left.toFixed(1)}" y="${y + 3}" width="${barWidth.toFixed(1)}" height="${ROW_HEIGHT - 6}" rx="2" fill="${FILL[kind] ?? '#999'}"${open}/>` +
    `<text x="${(left + barWidth + 4).toFixed(1)}" y="${y + 13}" fill="#6b7585">${escapeHtml(duration)}</text></g>`
  );
}
