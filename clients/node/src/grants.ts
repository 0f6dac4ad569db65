/**
 * What a store's role must be granted, checked at its first call: a missing grant fails
 * every request loudly with the GRANT that mends it, instead of failing one method where the
 * library only logs it (express-rate-limit's decrement).
 */
import type { RateLimiter } from "./index.js";

export class Grants {
  private granted: Promise<void> | undefined;

  /** `needs`: each function of the extension's schema the store calls, and what calls it. */
  constructor(
    private readonly limiter: RateLimiter,
    private readonly store: string,
    private readonly needs: () => Record<string, string>,
  ) {}

  /** Resolves once the role may execute every function it needs (asked once, until it may:
   * a missing grant is asked again at the next call, so granting it mends a running process). */
  require(): Promise<void> {
    this.granted ??= this.check().catch((error) => {
      this.granted = undefined;
      throw error;
    });
    return this.granted;
  }

  private async check(): Promise<void> {
    const needs = this.needs();
    const { role, missing } = await this.limiter.missingGrants(Object.keys(needs));
    if (missing.length === 0) return;
    const schema = this.limiter.schema;
    const what = missing.map((fn) => `${schema}.${fn} (${needs[fn]})`).join(", ");
    const grants = missing.map((fn) => `GRANT EXECUTE ON FUNCTION ${schema}.${fn} TO ${role};`).join(" ");
    throw new Error(`${this.store}: the role ${role} may not execute ${what}. As its owner: GRANT USAGE ON SCHEMA ${schema} TO ${role}; ${grants}`);
  }
}
