// Readiness probes that answer within a deadline whatever the dependency does.

export type Probe = { ok: true } | { ok: false; reason: string };

/** Runs `check`; its failure or a missed deadline becomes a reason (the late result is dropped). */
export async function withDeadline(timeoutMs: number, timeoutReason: string, check: () => Promise<unknown>): Promise<Probe> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<Probe>((resolve) => {
    timer = setTimeout(() => resolve({ ok: false, reason: timeoutReason }), timeoutMs);
  });
  const attempt = check().then(
    (): Probe => ({ ok: true }),
    (error: unknown): Probe => ({ ok: false, reason: describeFailure(error) }),
  );
  try {
    return await Promise.race([attempt, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** The most specific message of an error chain, e.g. "the database system is not yet accepting connections". */
function describeFailure(error: unknown): string {
  let message = error instanceof Error ? error.message : String(error);
  for (let current = error, depth = 0; current instanceof Error && depth < 5; current = (current as { cause?: unknown }).cause, depth += 1) {
    if (current.message) message = current.message;
  }
  return message.slice(0, 200);
}
