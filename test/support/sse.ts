// A minimal SSE reader over fetch, for what the SDK client does not expose (Last-Event-ID, ids).

export type SseEvent = { id: number | null; data: unknown };

export async function readSse(response: Response, options: { stopAfter?: number } = {}): Promise<SseEvent[]> {
  const events: SseEvent[] = [];
  const reader = response.body!.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const parsed = takeSseEvents(buffer);
    buffer = parsed.rest;
    for (const event of parsed.events) {
      events.push(event);
      if (options.stopAfter !== undefined && events.length >= options.stopAfter) {
        await reader.cancel();
        return events;
      }
    }
  }
  return events;
}

/** The complete events at the start of `buffer` (blocks ended by a blank line, comments skipped), and what is left. */
export function takeSseEvents(buffer: string): { events: SseEvent[]; rest: string } {
  const events: SseEvent[] = [];
  let rest = buffer;
  let boundary: number;
  while ((boundary = rest.indexOf('\n\n')) >= 0) {
    const block = rest.slice(0, boundary);
    rest = rest.slice(boundary + 2);
    let id: number | null = null;
    const data: string[] = [];
    for (const line of block.split('\n')) {
      if (line.startsWith('id: ')) id = Number(line.slice(4));
      else if (line.startsWith('data: ')) data.push(line.slice(6));
    }
    if (data.length > 0) events.push({ id, data: JSON.parse(data.join('\n')) });
  }
  return { events, rest };
}
