import { describe, expect, it } from 'vitest';
import { escapeXml, formatDuration, renderWaterfallSvg, waterfallRows, type WaterfallSpan } from '../../../src/telemetry/waterfall-svg.js';

// The waterfall of docs/images/task-trace.svg: spans in tree order, bars on one time axis.

const span = (spanId: string, parentSpanId: string | null, name: string, startMs: number, endMs: number, kind = 1): WaterfallSpan => ({ spanId, parentSpanId, name, startMs, endMs, kind });

const trace = [
  span('c', 'a', 'invoke_agent echo', 1010, 1060),
  span('a', null, 'A2A SendMessage', 1000, 1100, 2),
  span('d', 'c', 'chat echo', 1020, 1040, 3),
  span('b', 'a', 'keel.completion_batch', 1070, 1090),
  span('e', 'gone', 'push.deliver', 1200, 1250, 3),
];

describe('waterfallRows', () => {
  it('puts each child under its parent, siblings by start, and a span whose parent is missing at the top', () => {
    expect(waterfallRows(trace).map(({ span: { name }, depth }) => `${depth} ${name}`)).toEqual([
      '0 A2A SendMessage',
      '1 invoke_agent echo',
      '2 chat echo',
      '1 keel.completion_batch',
      '0 push.deliver',
    ]);
  });

  it('shows every span of a parent loop once', () => {
    const looped = [span('x', 'y', 'x', 0, 1), span('y', 'x', 'y', 1, 2)];
    expect(waterfallRows(looped).map((row) => row.span.name).sort()).toEqual(['x', 'y']);
  });
});

describe('renderWaterfallSvg', () => {
  it('draws a bar per span, proportional to its time on one axis', () => {
    const svg = renderWaterfallSvg(trace, { title: 'One task', width: 1100 });
    expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg" width="1100"')).toBe(true);
    expect(svg.trimEnd().endsWith('</svg>')).toBe(true);
    expect(svg).toContain('>One task</text>');
    expect(svg).toContain('5 spans, 250 ms');
    // The chart runs from x=320 to x=950 (1100 - 320 label - 150 margin) over 250 ms.
    const bars = [...svg.matchAll(/<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)" height="14" rx="2" fill="(#[0-9a-f]+)"\/>/g)].map((match) => [Number(match[1]), Number(match[2]), match[3]]);
    expect(bars).toEqual([
      [320, 252, '#d6863b'],
      [345.2, 126, '#6c8ebf'],
      [370.4, 50.4, '#7aa360'],
      [496.4, 50.4, '#6c8ebf'],
      [824, 126, '#7aa360'],
    ]);
    // An axis in round steps, and the colours' legend.
    expect([...svg.matchAll(/font-size="10">([^<]+)<\/text>/g)].map((match) => match[1])).toEqual(['0 ms', '50 ms', '100 ms', '150 ms', '200 ms', '250 ms']);
    expect(svg).toContain('>server</text>');
    // Rows are indented by depth.
    expect(svg).toMatch(/<text x="40" y="\d+" fill="#222"><title>chat echo<\/title>chat echo<\/text>/);
  });

  it('escapes names and says so when there is nothing to draw', () => {
    const svg = renderWaterfallSvg([span('a', null, 'execute_tool <a&b>', 0, 1)]);
    expect(svg).toContain('execute_tool &lt;a&amp;b&gt;');
    expect(svg).not.toContain('<a&b>');
    expect(renderWaterfallSvg([], { title: 'Empty' })).toContain('>no spans</text>');
  });

  it('formats durations and escapes text', () => {
    expect([0.42, 12.34, 250, 1250].map(formatDuration)).toEqual(['0.42 ms', '12.3 ms', '250 ms', '1.25 s']);
    expect(escapeXml(`"it's" <x> & y`)).toBe('&quot;it&apos;s&quot; &lt;x&gt; &amp; y');
  });
});
