import { randomUUID } from "node:crypto";

/** A limit name of the test's own. */
export function unique(prefix) {
  return `${prefix}_${randomUUID().slice(0, 8)}`;
}

/** Start `server` (a node http.Server or anything with listen) on loopback; its base URL. */
export async function listening(listen) {
  const address = await listen();
  return `http://127.0.0.1:${address.port}`;
}
