import { basename, extname } from 'node:path';
import { fileURLToPath } from 'node:url';

// Why a module the config names (a statechart machine, a tool module, a guardrail hook) could not
// be loaded, as a person fixes it: the file, line and column, the reason, and the lines around it.
// Pure: the caller hands in a way to read a file's source (and, for a syntax error Node reports
// without a place, a syntax check of the module's own text), so every shape is unit-tested.
//
// The shapes an import's error takes when Keel runs compiled (tsx's loader registered in Node 20):
//   - a TypeScript syntax error: esbuild's TransformError; it crosses the loader's thread as name,
//     message and stack only, so its `errors[]` is gone and each error is a message line
//     `<file>:<line>:<column>: ERROR: <text>` (in-thread, `errors[].location` has the same);
//   - a missing export: a SyntaxError whose stack starts `<file>:<line>`, the source line and a caret;
//   - a JavaScript syntax error: a SyntaxError with no place at all (the syntax check finds it);
//   - a package or file not found: ERR_MODULE_NOT_FOUND, naming the importing file, not the line;
//   - a throw while the module runs: any error, whose first stack frame in a file of the team's
//     (not node:, not node_modules) is where it was thrown (tsx maps it to the TypeScript line).

export type SourcePlace = { file: string; line: number; column: number };

/** One reason a module did not load: where (when Keel could find it) and what. */
export type LoadErrorReport = { place: SourcePlace | null; reason: string };

export type SourceAccess = {
  /** The text of a file, null when it cannot be read. */
  read: (file: string) => string | null;
  /** A syntax check of a module's own text: its errors with their places (esbuild's). */
  syntaxErrors: (file: string) => LoadErrorReport[];
};

/** Lines shown before and after the line in error. */
const FRAME_CONTEXT = 2;
/** A source line longer than this is cut around the column in the frame. */
const FRAME_WIDTH = 160;

const ESBUILD_LINE = /^(.+?):(\d+):(\d+): ERROR: (.*)$/;
const ESBUILD_UNPLACED = /^error: (.*)$/;
const STACK_HEADER = /^(.+):(\d+)$/;
const STACK_FRAME = /^\s*at (?:.*? \()?(.+?):(\d+):(\d+)\)?$/;
const NOT_FOUND = /^Cannot find (module|package) '([^']+)' imported from (.+)$/;

/** A path from an error (a file: URL or a path) as a path. */
function pathOf(text: string): string {
  if (!text.startsWith('file://')) return text;
  try {
    return fileURLToPath(text);
  } catch {
    return text;
  }
}

const firstLine = (text: string) => text.split('\n')[0] ?? '';

/** A file of the team's own: not Node's, not a dependency's, not Keel's loader. */
const ownFile = (file: string) => !file.startsWith('node:') && !file.includes('/node_modules/') && !file.startsWith('internal/') && (file.startsWith('/') || file.startsWith('file://') || /^[A-Za-z]:\\/.test(file));

/** The reasons an import failed, each with its place where one can be found. */
export function loadErrorReports(error: unknown, modulePath: string, sources: SourceAccess): LoadErrorReport[] {
  if (!(error instanceof Error)) return [{ place: null, reason: `threw ${JSON.stringify(error) ?? String(error)}` }];
  const message = error.message;

  // esbuild, in the same thread: its messages with their locations.
  const messages = (error as { errors?: unknown }).errors;
  if (Array.isArray(messages) && messages.length > 0) {
    return messages.map((entry: { text?: string; location?: { file?: string; line?: number; column?: number } | null }) => {
      const location = entry.location;
      // esbuild's columns count from 0.
      return location?.file && location.line
        ? { place: { file: pathOf(location.file), line: location.line, column: (location.column ?? 0) + 1 }, reason: entry.text ?? message }
        : { place: null, reason: entry.text ?? message };
    });
  }
  // esbuild through tsx's loader thread: only the message's lines are left.
  if (message.startsWith('Transform failed with')) {
    const reports: LoadErrorReport[] = [];
    for (const line of message.split('\n').slice(1)) {
      const placed = ESBUILD_LINE.exec(line);
      if (placed) reports.push({ place: { file: pathOf(placed[1]!), line: Number(placed[2]), column: Number(placed[3]) + 1 }, reason: placed[4]! });
      const unplaced = ESBUILD_UNPLACED.exec(line);
      if (unplaced) reports.push({ place: null, reason: unplaced[1]! });
    }
    if (reports.length > 0) return reports;
  }
  // A bundler's error (vite, when tests load the module): `loc`.
  const loc = (error as { loc?: { file?: string; line?: number; column?: number } }).loc;
  if (loc?.line && (loc.file ?? (error as { id?: string }).id)) {
    return [{ place: { file: pathOf((loc.file ?? (error as { id?: string }).id)!), line: loc.line, column: (loc.column ?? 0) + 1 }, reason: firstLine(message) }];
  }

  const reason = `${error.name}: ${firstLine(message)}`;
  const stack = error.stack ?? '';
  // Node's own place for an error at link time (a missing export): "<file>:<line>", the line, a caret.
  const [header, sourceLine, caret] = stack.split('\n');
  const headed = header === undefined ? null : STACK_HEADER.exec(header);
  if (headed && ownFile(headed[1]!)) {
    const file = pathOf(headed[1]!);
    const column = caret !== undefined && /^\s*\^/.test(caret) ? caret.indexOf('^') + 1 : 1;
    return [{ place: placeInSource(sources, file, Number(headed[2]), column, sourceLine ?? ''), reason }];
  }

  const notFound = NOT_FOUND.exec(firstLine(message));
  if (notFound) {
    const importer = pathOf(notFound[3]!);
    return [{ place: importPlace(sources, importer, notFound[1] === 'package' ? notFound[2]! : basename(notFound[2]!)), reason }];
  }

  if (error.name === 'SyntaxError') {
    // Node names no place for a syntax error in a JavaScript module: the module's own text is
    // checked for it; when that is clean, the error is in a module it imports.
    const found = sources.syntaxErrors(modulePath);
    if (found.length > 0) return found;
    return [{ place: null, reason: `${reason} (in a module ${basename(modulePath)} imports: Node does not say which)` }];
  }

  // Thrown while the module ran: the first frame in a file of the team's.
  for (const line of stack.split('\n').slice(1)) {
    const frame = STACK_FRAME.exec(line);
    if (frame && ownFile(frame[1]!)) return [{ place: { file: pathOf(frame[1]!), line: Number(frame[2]), column: Number(frame[3]) }, reason }];
  }
  return [{ place: null, reason }];
}

/**
 * Node's place names the line of the code it ran, which tsx may have moved: the line as Node shows
 * it is looked for in the source, nearest first, so the frame shows the team's own line.
 */
function placeInSource(sources: SourceAccess, file: string, line: number, column: number, shown: string): SourcePlace {
  const source = sources.read(file);
  const wanted = shown.trim();
  if (source === null || wanted === '') return { file, line, column };
  const lines = source.split('\n');
  if (lines[line - 1]?.trim() === wanted) return { file, line, column };
  const indent = shown.length - shown.trimStart().length;
  let best: number | null = null;
  lines.forEach((text, index) => {
    if (text.trim() === wanted && (best === null || Math.abs(index + 1 - line) < Math.abs(best - line))) best = index + 1;
  });
  if (best === null) return { file, line, column };
  const found: number = best;
  const foundIndent = lines[found - 1]!.length - lines[found - 1]!.trimStart().length;
  return { file, line: found, column: Math.max(1, column - indent + foundIndent) };
}

/** The line of `importer` that imports `name` (a package, or a file by its base name), if it can be found. */
function importPlace(sources: SourceAccess, importer: string, name: string): SourcePlace | null {
  const source = sources.read(importer);
  if (source === null) return null;
  const stem = name.slice(0, name.length - extname(name).length);
  const candidates = [name, ...(stem !== '' && stem !== name ? [stem] : [])];
  const lines = source.split('\n');
  for (const candidate of candidates) {
    for (const [index, text] of lines.entries()) {
      if (!/\bimport\b|\bfrom\b|\brequire\b/.test(text)) continue;
      for (const quote of ["'", '"', '`']) {
        // The specifier: the name itself, a path ending in it, or a package's subpath.
        const at = [`${quote}${candidate}${quote}`, `/${candidate}${quote}`, `${quote}${candidate}/`].map((needle) => text.indexOf(needle)).find((found) => found >= 0);
        if (at === undefined) continue;
        const start = text[at] === quote ? at : text.lastIndexOf(quote, at);
        return { file: importer, line: index + 1, column: start + 1 };
      }
    }
  }
  return { file: importer, line: 1, column: 1 };
}

/**
 * A few lines around `line` with its number marked and a caret under `column` (1-based both);
 * null when the line is not in the source.
 */
export function codeFrame(source: string, line: number, column: number, context = FRAME_CONTEXT): string | null {
  const lines = source.split('\n').map((text) => text.replace(/\r$/, ''));
  if (line < 1 || line > lines.length) return null;
  const first = Math.max(1, line - context);
  const last = Math.min(lines.length, line + context);
  const width = String(last).length;
  const out: string[] = [];
  for (let number = first; number <= last; number += 1) {
    let text = lines[number - 1]!;
    let caretAt = Math.max(0, Math.min(column - 1, text.length));
    if (text.length > FRAME_WIDTH) {
      // A long (minified) line: the part around the column.
      const start = Math.max(0, Math.min(caretAt - FRAME_WIDTH / 2, text.length - FRAME_WIDTH));
      text = `${start > 0 ? '…' : ''}${text.slice(start, start + FRAME_WIDTH)}…`;
      if (number === line) caretAt = caretAt - start + (start > 0 ? 1 : 0);
    }
    out.push(`${number === line ? '>' : ' '} ${String(number).padStart(width)} | ${text}`.trimEnd());
    if (number === line) {
      // Tabs stay tabs, so the caret lines up however the terminal shows them.
      const padding = text.slice(0, caretAt).replace(/[^\t]/g, ' ');
      out.push(`  ${' '.repeat(width)} | ${padding}^`);
    }
  }
  return out.join('\n');
}

/**
 * The reports as text: `<file>:<line>:<column>: <reason>`, then the code frame indented under
 * it. `display` shortens a path for the reader (relative to the working directory).
 */
export function formatLoadError(reports: readonly LoadErrorReport[], read: (file: string) => string | null, display: (file: string) => string): string {
  return reports
    .map((report) => {
      if (report.place === null) return report.reason;
      const { file, line, column } = report.place;
      const source = read(file);
      const frame = source === null ? null : codeFrame(source, line, column);
      const head = `${display(file)}:${line}:${column}: ${report.reason}`;
      return frame === null ? head : `${head}\n${frame.split('\n').map((text) => `    ${text}`).join('\n')}`;
    })
    .join('\n');
}

/** A problem line of the config's report, with the load error's text indented under it. */
export const loadProblem = (head: string, text: string): string => `${head}:\n${text.split('\n').map((line) => `  ${line}`).join('\n')}`;

/** Problems as a list, one `- ` item each, a problem's further lines (a code frame) indented under it. */
export const problemList = (problems: readonly string[]): string => problems.map((problem) => `  - ${problem.split('\n').join('\n    ')}`).join('\n');
