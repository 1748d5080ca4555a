// One trace as a waterfall picture (docs/images/task-trace.svg): a row per span in tree order
// (each child under its parent, siblings by start time), the span's name indented by its depth
// on the left, a bar from its start to its end on a shared time axis on the right. Pure: span list
// in, SVG text out.

export type WaterfallSpan = {
  spanId: string;
  parentSpanId: string | null;
  name: string;
  /** Start and end in milliseconds on any common clock (epoch or relative). */
  startMs: number;
  endMs: number;
  /** OTLP's SpanKind (1 internal, 2 server, 3 client, 4 producer, 5 consumer); colours the bar. */
  kind?: number;
  /** A short note after the duration (e.g. the process role that recorded the span). */
  note?: string;
};

export type WaterfallOptions = { title?: string; width?: number };

export type WaterfallRow = { span: WaterfallSpan; depth: number };

const ROW_HEIGHT = 24;
const LABEL_WIDTH = 320;
const TOP = 72;
const BOTTOM = 16;
const RIGHT_MARGIN = 150;
const INDENT = 14;
const KIND_COLOURS: Record<number, string> = { 1: '#6c8ebf', 2: '#d6863b', 3: '#7aa360', 4: '#9b6cb8', 5: '#9b6cb8' };

/**
 * The rows in tree order. A span whose parent is not in the list (the trace's root, or a span of a
 * process that sent its parent elsewhere) starts a tree of its own; roots by start time.
 */
export function waterfallRows(spans: readonly WaterfallSpan[]): WaterfallRow[] {
  const ids = new Set(spans.map((span) => span.spanId));
  const children = new Map<string | null, WaterfallSpan[]>();
  for (const span of spans) {
    const parent = span.parentSpanId !== null && ids.has(span.parentSpanId) && span.parentSpanId !== span.spanId ? span.parentSpanId : null;
    children.set(parent, [...(children.get(parent) ?? []), span]);
  }
  const byStart = (a: WaterfallSpan, b: WaterfallSpan) => a.startMs - b.startMs || a.endMs - b.endMs || a.name.localeCompare(b.name);
  const rows: WaterfallRow[] = [];
  const seen = new Set<string>();
  const visit = (span: WaterfallSpan, depth: number) => {
    if (seen.has(span.spanId)) return;
    seen.add(span.spanId);
    rows.push({ span, depth });
    for (const child of [...(children.get(span.spanId) ?? [])].sort(byStart)) visit(child, depth + 1);
  };
  for (const root of [...(children.get(null) ?? [])].sort(byStart)) visit(root, 0);
  // A loop of parents (never produced by an SDK) still shows every span, at the top level.
  for (const span of [...spans].sort(byStart)) visit(span, 0);
  return rows;
}

export function escapeXml(text: string): string {
  return text.replace(/[<>&'"]/g, (char) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', "'": '&apos;', '"': '&quot;' })[char]!);
}

/** A duration as people read it: 0.42 ms, 12.3 ms, 1.25 s. */
export function formatDuration(ms: number): string {
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 100) return `${ms.toFixed(1)} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(2)} s`;
}

/** A round step for about six ticks across `total` ms. */
function tickStep(total: number): number {
  const raw = Math.max(total, 0.001) / 6;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((factor) => factor * power).find((candidate) => candidate >= raw)!;
  return step;
}

const fixed = (value: number) => Number(value.toFixed(2));

/** An axis label: whole milliseconds (or seconds) when the step allows. */
function tickLabel(ms: number, step: number): string {
  if (step >= 1000) return `${Number((ms / 1000).toFixed(3))} s`;
  if (step >= 1) return `${Math.round(ms)} ms`;
  return `${Number(ms.toFixed(3))} ms`;
}

const KIND_LEGEND: Array<[number, string]> = [
  [2, 'server'],
  [1, 'internal'],
  [3, 'client'],
];

export function renderWaterfallSvg(spans: readonly WaterfallSpan[], options: WaterfallOptions = {}): string {
  const width = options.width ?? 1100;
  const rows = waterfallRows(spans);
  const start = Math.min(...spans.map((span) => span.startMs));
  const end = Math.max(...spans.map((span) => span.endMs));
  const total = rows.length === 0 ? 0 : Math.max(end - start, 0.001);
  const chartLeft = LABEL_WIDTH;
  const chartWidth = width - LABEL_WIDTH - RIGHT_MARGIN;
  const height = TOP + Math.max(rows.length, 1) * ROW_HEIGHT + BOTTOM;
  const x = (ms: number) => fixed(chartLeft + ((ms - start) / total) * chartWidth);
  const title = options.title ?? 'Trace';
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="ui-monospace, Menlo, Consolas, monospace" font-size="12">`,
    `<rect width="${width}" height="${height}" fill="#ffffff"/>`,
    `<text x="12" y="22" font-size="14" font-weight="bold" fill="#222">${escapeXml(title)}</text>`,
  ];
  if (rows.length === 0) {
    out.push(`<text x="12" y="${TOP + 16}" fill="#666">no spans</text>`, '</svg>');
    return out.join('\n') + '\n';
  }
  out.push(`<text x="12" y="42" fill="#666">${escapeXml(`${rows.length} spans, ${formatDuration(end - start)}`)}</text>`);
  KIND_LEGEND.forEach(([kind, label], index) => {
    const legendX = chartLeft + index * 90;
    out.push(`<rect x="${legendX}" y="33" width="10" height="10" rx="2" fill="${KIND_COLOURS[kind]}"/>`, `<text x="${legendX + 14}" y="42" fill="#666" font-size="11">${label}</text>`);
  });
  const step = tickStep(total);
  for (let index = 0; index * step <= total + 1e-9; index += 1) {
    const tick = index * step;
    const tickX = x(start + tick);
    out.push(`<line x1="${tickX}" y1="${TOP - 6}" x2="${tickX}" y2="${height - BOTTOM}" stroke="#e4e4e4"/>`);
    out.push(`<text x="${tickX}" y="${TOP - 10}" text-anchor="middle" fill="#888" font-size="10">${escapeXml(tickLabel(tick, step))}</text>`);
  }
  rows.forEach(({ span, depth }, index) => {
    const top = TOP + index * ROW_HEIGHT;
    if (index % 2 === 1) out.push(`<rect x="0" y="${top}" width="${width}" height="${ROW_HEIGHT}" fill="#f7f7f9"/>`);
    const label = span.name.length > 40 - depth * 2 ? `${span.name.slice(0, 39 - depth * 2)}…` : span.name;
    out.push(`<text x="${12 + depth * INDENT}" y="${top + 16}" fill="#222"><title>${escapeXml(span.name)}</title>${escapeXml(label)}</text>`);
    const barX = x(span.startMs);
    const barWidth = Math.max(fixed(x(span.endMs) - barX), 1);
    const colour = KIND_COLOURS[span.kind ?? 1] ?? KIND_COLOURS[1]!;
    out.push(`<rect x="${barX}" y="${top + 5}" width="${barWidth}" height="${ROW_HEIGHT - 10}" rx="2" fill="${colour}"/>`);
    const duration = formatDuration(span.endMs - span.startMs) + (span.note ? `  ${span.note}` : '');
    out.push(`<text x="${fixed(barX + barWidth + 6)}" y="${top + 16}" fill="#444" font-size="11">${escapeXml(duration)}</text>`);
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}
