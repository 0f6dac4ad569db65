import { createHash } from "node:crypto";

/** The extension's longest limit name, in bytes. */
const MAX_NAME_BYTES = 128;

/** A limit name from parts a library gives (a prefix, a route): as it is when it fits, else
 * its start and a SHA-256 of the whole, so that two routes never share a name. */
export function limitName(...parts: string[]): string {
  const name = parts.filter((p) => p !== "").join(":");
  if (Buffer.byteLength(name) <= MAX_NAME_BYTES) return name;
  const digest = createHash("sha256").update(name).digest("hex").slice(0, 32);
  // The first characters that fit in 64 bytes: never a character cut in two.
  let start = "";
  for (const c of name) {
    if (Buffer.byteLength(start + c) > 64) break;
    start += c;
  }
  return `${start}~${digest}`;
}

/** The inline fixed window of `limit` tokens per `windowMs` that the libraries' counters are. */
export function fixedWindow(limit: number, windowMs: number, extra: Record<string, unknown> = {}): Record<string, unknown> {
  if (!(Number.isFinite(limit) && limit > 0)) throw new RangeError(`the limit must be a number > 0, not ${limit}`);
  if (!(Number.isFinite(windowMs) && windowMs >= 1)) throw new RangeError(`the window must be at least 1 ms, not ${windowMs}`);
  return { kind: "fixed window", rate: limit, period: windowMs, ...extra };
}
